"""Nothing lost, round 4 (issue 37): the items its first pass left open (docs/reliability.md):
resume mismatches of options outside RunConfig, `store convert` and `export --out` after a kill,
every suggested command parses, partly overlapping stores. Each test failed before its fix."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import typer

from bad_workspace import run_cli, ws  # noqa: F401  (ws is a fixture)

SRC = Path(__file__).resolve().parents[1] / "src" / "specdraft"


# ----------------------------------------------------------------------------- 7. every suggested command parses

HOLE = "\0"
# where a suggested command ends inside a message
COMMAND_END = re.compile(r"`|;|\(|\)|,\s|\n|<| or | then | and |\.\s|\.$|\"|'|: ")


def _text(node) -> str | None:
    """A string literal's text; an f-string's with each {expression} as a hole (F: a run of flags)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else
                       HOLE + ("F" if "flags" in ast.unparse(v.value) else "V") + HOLE for v in node.values)
    return None


def suggested_commands(commands: set[str]) -> list[tuple[str, str]]:
    """(where, command) for every `specdraft SUB ...` in a string or f-string of the sources."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        for node in ast.walk(tree):
            text = None if id(node) in inner else _text(node)
            for m in re.finditer(r"\bspecdraft ([a-z]+)\b", text or ""):
                if m.group(1) in commands:
                    rest = text[m.start():]
                    end = COMMAND_END.search(rest, m.end() - m.start())
                    found.append((f"{path.relative_to(SRC)}:{node.lineno}", (rest[:end.start()] if end else rest).strip()))
    return found


def words(command: str) -> list[str]:
    """The command's arguments after `specdraft`: an f-string hole is a value (1) or, for a run of
    flags, nothing; a placeholder in capitals (RUN, N, K, WS/hidden...) is a value as it stands."""
    command = command.replace(f"{HOLE}F{HOLE}", " ").replace(f"{HOLE}V{HOLE}", "1")
    command = command.replace("[", "").replace("]", "").replace("...", "")
    out = [("1" if re.fullmatch(r"[A-Z_]+", word) else word)    # N, K as numbers parse; RUN as a path too
           for word in shlex.split(command)[1:]]
    return out[:-1] if out and out[-1].startswith("-") else out   # `capture --store-format`: naming a flag


def parse_error(cmd, name: str, args: list[str]) -> str | None:
    """What the parser (typer's click) says of `args`, None when it takes them. Only the parse: no
    command runs. A required option or argument that a fragment leaves out (`capture --resume`
    means the same command again with --resume) is filled with a value, so that what the fragment
    does say is still checked whole (click reports a missing option before an extra argument)."""
    args = list(args)
    for _ in range(len(cmd.params) + 1):
        try:
            cmd.make_context(name, list(args))
            return None
        except Exception as e:    # typer vendors click: its exception classes are named, not imported
            param = getattr(e, "param", None)
            if type(e).__name__ == "MissingParameter" and param is not None:
                args += ["1"] if param.param_type_name == "argument" else [param.opts[0], "1"]
                continue
            return e.format_message() if hasattr(e, "format_message") else str(e)
    return f"still missing parameters after filling them: {args}"


def test_every_command_the_tool_suggests_parses():
    """Each `specdraft ...` in an error, a note or a next-step line names a command, options it has
    and values they take (required options a fragment leaves out are fine: `capture --resume`
    means the same command again with --resume)."""
    from specdraft import cli

    root = typer.main.get_command(cli.app)
    found = suggested_commands(set(root.commands))
    assert len(found) > 50, found          # the sources' suggestions were found at all
    bad = []
    for where, command in found:
        args = words(command)
        cmd, name = root, "specdraft"
        while hasattr(cmd, "commands") and args and args[0] in cmd.commands:   # store convert, vocab build
            cmd, name = cmd.commands[args[0]], f"{name} {args[0]}"
            args = args[1:]
        error = parse_error(cmd, name, args)
        if error:
            bad.append(f"{where}: {command.replace(HOLE, '')!r}: {error}")
    assert not bad, "\n".join(bad)


def test_the_checker_finds_a_command_that_does_not_parse():
    """The check above can fail: an old flag name, an unknown command's option and a value of the
    wrong type are each caught."""
    from specdraft import cli

    root = typer.main.get_command(cli.app)
    for command in ("specdraft plan -k 3", "specdraft export RUN --json FILE", "specdraft eval --drafter RUN -k many"):
        args = words(command)
        assert parse_error(root.commands[args[0]], args[0], args[1:]), command


# ----------------------------------------------------------------------------- 6. a killed write never blocks its fix

# Runs the CLI in a new process that SIGKILLs itself at the N-th call of MODULE.FUNC (after the
# call returns, or, with "inside", after writing half a file where the call would write): a real
# kill, so no `finally` or `except` of ours runs, as when a user's job is killed.
KILLER = r"""
import os, signal, sys, importlib
module, func, nth, mode, match = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
owner = importlib.import_module(module)
real, calls = getattr(owner, func), [0]
def killing(*args, **kwargs):
    if match not in repr((args, kwargs)):
        return real(*args, **kwargs)
    calls[0] += 1
    if calls[0] == nth and mode == "inside":
        target = next(a for a in [*args, *kwargs.values()] if isinstance(a, (str, os.PathLike)))
        with open(target, "wb") as f:
            f.write(b"half a file")
    if calls[0] == nth and mode in ("inside", "before"):
        os.kill(os.getpid(), signal.SIGKILL)
    result = real(*args, **kwargs)
    if calls[0] == nth:
        os.kill(os.getpid(), signal.SIGKILL)
    return result
setattr(owner, func, killing)
sys.argv = ["specdraft", *sys.argv[6:]]
from specdraft import cli
cli.main()
"""


def killed_run(where: str, nth: int, mode: str, args: list, match: str = "") -> None:
    """The CLI with `args` in a new process that SIGKILLs itself at the nth call of `where` whose
    arguments contain `match`: before it, after it, or inside it (half a file written to its path)."""
    import os
    import subprocess
    import sys

    module, func = where.rsplit(".", 1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", KILLER, module, func, str(nth), mode, match, *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == -9, f"not killed (exit {proc.returncode}):\n{proc.stderr}"


def one_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_store_convert_after_a_kill_finishes_or_refuses_in_one_line(ws, tmp_path, monkeypatch, capsys):
    """A conversion killed while writing its second shard (a half-written temp file left), or right
    after its first: the unfinished store is never read as complete, the source is untouched, the
    same command again finishes it with the shards an uninterrupted run writes, and another format
    into it is one line. Before: the re-run was refused ("exists and is not empty") and the folder
    had to be found and deleted by hand; a kill before the first shard left no manifest at all."""
    from bad_workspace import tree_hash
    from specdraft.data.store import HiddenStore, read_manifest
    from specdraft.errors import SpecdraftError

    src = ws["root"] / "hidden"
    assert len(read_manifest(src)["shards"]) >= 3    # the kill lands mid-store
    before = tree_hash(src)
    clean = tmp_path / "clean-fp8"
    assert run_cli(monkeypatch, capsys, ["store", "convert", src, "--store-format", "fp8", "--out", clean])[0] == 0
    for nth, mode in ((2, "inside"), (1, "after")):
        out = tmp_path / f"fp8-killed-{nth}"
        killed_run("safetensors.torch.save_file", nth, mode, ["store", "convert", src, "--store-format", "fp8",
                                                              "--out", out])
        assert tree_hash(src) == before
        assert (out / "manifest.json").is_file() and not read_manifest(out)["complete"]
        try:
            HiddenStore(out)
            raise AssertionError("an unfinished conversion was read as a store")
        except SpecdraftError as e:
            assert "conversion did not finish" in str(e) and f"store convert {src} --store-format fp8" in str(e)
        line = one_line(*run_cli(monkeypatch, capsys, ["store", "convert", src, "--store-format", "compact",
                                                       "--out", out])[:2])
        assert "store_format \"fp8\"" in line and "pass --store-format fp8 to finish it" in line, line
        code, err, _ = run_cli(monkeypatch, capsys, ["store", "convert", src, "--store-format", "fp8", "--out", out])
        assert code == 0, err
        assert tree_hash(out) == tree_hash(clean) and tree_hash(src) == before
        assert len(HiddenStore(out, verify=True)) == len(HiddenStore(src))


def test_export_out_between_a_kill_and_the_re_run(ws, tmp_path, monkeypatch, capsys):
    """export killed while writing the weights (first export into --out), and killed between the two
    renames that swap a new export in over an old one (--out then missing, the old export set aside):
    the next run, even one that fails, puts the old export back first; the re-run finishes with the
    files a clean export writes and leaves no leftover. Before: a failed re-run after the second kill
    left --out missing and the set-aside export was deleted by the next export."""
    from specdraft.formats.checkpoints import load_checkpoint

    src = ws["root"] / "drafter"
    files = ("config.json", "model.safetensors")

    def export(out, *extra):
        return run_cli(monkeypatch, capsys, ["export", src, "--out", out, *extra])

    def hashes(out):
        import hashlib
        return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in files}

    assert export(tmp_path / "clean")[0] == 0
    clean = hashes(tmp_path / "clean")

    out = tmp_path / "first"
    killed_run("safetensors.torch.save_file", 1, "inside", ["export", src, "--out", out])
    assert not (out / "config.json").exists()     # nothing there passes for an export
    code, err, _ = export(out)
    assert code == 0, err
    assert hashes(out) == clean and load_checkpoint(out)[1] is not None
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    out = tmp_path / "swapped"
    assert export(out, "--weights-dtype", "float32")[0] == 0
    old = hashes(out)
    killed_run("os.replace", 1, "after", ["export", src, "--out", out], match=".old")
    assert not out.exists()                       # the kill came between the two renames
    line = one_line(*export(out, "--weights-dtype", "int8")[:2])
    assert "--weights-dtype int8" in line, line
    assert hashes(out) == old                     # the old export is back, whole
    code, err, _ = export(out)
    assert code == 0, err
    assert hashes(out) == clean
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# ----------------------------------------------------------------------------- 1. stores that share some samples

def test_partly_overlapping_stores_train_each_sample_once(ws, tmp_path, monkeypatch, capsys):
    """`train --store A --store B` where B shares 5 of its 10 samples with A (two captures of
    overlapping data): the copies are dropped with one warning line naming both stores, the run
    trains on the 15 distinct samples, and no validation sample has an exact copy in training.
    Before: 20 samples, the shared ones twice, some of them on both sides of the split."""
    from bad_workspace import conv, write_jsonl
    from rich.console import Console
    from specdraft.data import capture as cap
    from specdraft.data.prepare import prepare
    from specdraft.data.store_parts import StoreParts
    from specdraft.train.batches import split_samples

    records = [conv(f"question {i}", f"answer number {i} " * 3) for i in range(5, 15)]   # A holds 0..9
    prepare(model=ws["target"], source=str(write_jsonl(tmp_path / "b.jsonl", records)), out=tmp_path / "data-b",
            console=Console(stderr=True, quiet=True))
    cap.capture(model=ws["target"], data=tmp_path / "data-b", out=tmp_path / "hidden-b", layers=[2, 4, 5],
                dtype="float32", shard_tokens=200, progress=False)
    a, b = ws["root"] / "hidden", tmp_path / "hidden-b"

    union = StoreParts([a, b])
    tokens = [tuple(union[i]["input_ids"].tolist()) for i in range(len(union))]
    train_ids, val_ids = split_samples(len(union), 0.3, 0)
    assert val_ids and not {tokens[i] for i in val_ids} & {tokens[i] for i in train_ids}
    assert len(union) == len(set(tokens)) == 15
    assert union.num_tokens == sum(map(len, tokens)) < union.parts[0].num_tokens + union.parts[1].num_tokens
    capsys.readouterr()

    out = tmp_path / "run-overlap"
    code, err, _ = run_cli(monkeypatch, capsys, ["train", "--store", a, "--store", b, "--vocab",
                                                 ws["root"] / "vocab.safetensors", "--model", ws["target"], "--out", out,
                                                 "--epochs", "1", "--max-tokens", "256", "--val-fraction", "0.3",
                                                 "--no-progress"])
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:") and "same tokens" in line]
    assert len(warnings) == 1 and f"--store {b}: 5 of its 10 samples" in warnings[0], err
    assert f"5 in --store {a}" in warnings[0], warnings
    import json
    inputs = json.loads(next(out.glob("checkpoints/*/inputs.json")).read_text())
    assert inputs["num_samples"] == 15, inputs


# ----------------------------------------------------------------------------- 2. resume: options outside RunConfig

def test_train_resume_refuses_hidden_states_of_another_store_format(ws, tmp_path, monkeypatch, capsys):
    """--store-format is no RunConfig setting (a store's format is its manifest's; online, a launch
    flag), so `--resume` took fp8 (or bf16) hidden states into a run begun on the other without a
    word. Now the checkpoint records the format and the resume is one line naming it and the fix."""
    from specdraft.data.store_convert import convert_store

    vocab, model = ws["root"] / "vocab.safetensors", ws["target"]
    common = ["--vocab", vocab, "--model", model, "--max-tokens", "256", "--epochs", "2", "--save-every", "1",
              "--no-progress"]
    run = tmp_path / "run-bf16"
    code, err, _ = run_cli(monkeypatch, capsys, ["train", "--store", ws["root"] / "hidden", "--out", run,
                                                 "--stop-after", "1", *common])
    assert code == 0, err
    fp8 = tmp_path / "hidden-fp8"
    convert_store(ws["root"] / "hidden", fp8, "fp8")
    line = one_line(*run_cli(monkeypatch, capsys, ["train", "--out", run, "--resume", "--store", fp8])[:2])
    assert "store format:" in line and "trained on bf16 hidden states" in line and "are fp8" in line, line
    assert f"resume with a bf16 store (--store {ws['root'] / 'hidden'})" in line, line

    online = tmp_path / "run-online-fp8"
    code, err, _ = run_cli(monkeypatch, capsys, ["train", "--online", "--prepared", ws["root"] / "data",
                                                 "--store-format", "fp8", "--engine", "hf", "--out", online,
                                                 "--stop-after", "1", *common])
    assert code == 0, err
    line = one_line(*run_cli(monkeypatch, capsys, ["train", "--online", "--prepared", ws["root"] / "data",
                                                   "--engine", "hf", "--out", online, "--resume"])[:2])
    assert "trained on fp8 hidden states" in line and "resume with --online --store-format fp8" in line, line
    code, err, _ = run_cli(monkeypatch, capsys, ["train", "--online", "--prepared", ws["root"] / "data",
                                                 "--store-format", "fp8", "--engine", "hf", "--out", online,
                                                 "--resume"])
    assert code == 0, err      # the same format resumes


def test_capture_resume_says_it_keeps_the_recorded_batch_tokens(ws, tmp_path, monkeypatch, capsys):
    """capture --resume keeps the store's batch_tokens (shards byte-identical), which a different
    --batch-tokens silently lost; it now says so."""
    import shutil

    out = tmp_path / "hidden-resumed"
    shutil.copytree(ws["root"] / "hidden", out)
    code, err, _ = run_cli(monkeypatch, capsys, ["capture", "--prepared", ws["root"] / "data", "--model", ws["target"],
                                                 "--layers", "2,4,5", "--store-dtype", "float32", "--shard-tokens",
                                                 "200", "--out", out, "--resume", "--batch-tokens", "999"])
    assert code == 0, err
    assert "note: --batch-tokens 999:" in err and "captured with batch_tokens 4096, which the rest of it keeps" in err, err


def test_capture_resume_with_other_layers_names_them_as_typed(ws, tmp_path, monkeypatch, capsys):
    """(class 7) the fix said `pass --layers [2, 4, 5]`, which --layers does not parse."""
    import shutil

    out = tmp_path / "hidden-layers"
    shutil.copytree(ws["root"] / "hidden", out)
    line = one_line(*run_cli(monkeypatch, capsys, ["capture", "--prepared", ws["root"] / "data", "--model",
                                                   ws["target"], "--layers", "2,4", "--out", out, "--resume"])[:2])
    assert "pass --layers 2,4,5 or another --out" in line, line


def test_prepare_again_with_other_settings_takes_them(ws, tmp_path, monkeypatch, capsys):
    """prepare resumes regeneration from OUT/regen.jsonl, keyed by conversation and settings: a re-run
    with another --max-new-tokens (or other --conversations) is honoured, never mixed with the
    answers of the first run: its data equal a fresh prepare's with the new settings."""
    from specdraft.data.prepared import load_prepared

    def prepare(out, tokens):
        code, err, _ = run_cli(monkeypatch, capsys, ["prepare", "--model", ws["target"], "--conversations",
                                                     ws["root"] / "good.jsonl", "--regenerate", "--limit", "4",
                                                     "--max-new-tokens", str(tokens), "--engine", "hf", "--out", out])
        assert code == 0, err
        ds, meta = load_prepared(out)
        return ds["input_ids"], meta

    again = tmp_path / "data-again"
    first, _ = prepare(again, 3)
    second, meta = prepare(again, 9)
    fresh, _ = prepare(tmp_path / "data-fresh", 9)
    assert second == fresh != first and meta["regeneration"]["max_new_tokens"] == 9


def test_recipe_refuses_finished_stages_made_with_other_settings(ws, tmp_path, monkeypatch):
    """A recipe re-run skips finished stages: data of other --conversations, another samples or
    max_new_tokens, or a vocab of another size were used silently. Now one line names the file,
    the field, the recorded value and the fix, before any stage runs; matching settings continue."""
    import json
    import shutil

    from specdraft import pipeline
    from specdraft.errors import SpecdraftError

    workspace = tmp_path / "ws-recipe"
    shutil.copytree(ws["root"] / "data", workspace / "data")
    meta = json.loads((workspace / "data" / "prepare.json").read_text())
    meta.update(source="builtin", limit=6, regeneration={"max_new_tokens": 12})
    (workspace / "data" / "prepare.json").write_text(json.dumps(meta))
    recipe_text = ("epochs: 1\nrecipe: {samples: 6, max_new_tokens: 12, regen_batch: 3, draft_vocab: 32, "
                   "bench_prompts: 2, bench_tokens: 10, k: 2, bench_rounds: 1}\n")

    class Ran(Exception):
        pass

    def first_stage(console, args, log, name=None):
        raise Ran(args[0])

    monkeypatch.setattr(pipeline, "run_stage", first_stage)

    def recipe(text: str, data: str = "builtin") -> str:
        path = tmp_path / "r.yaml"
        path.write_text(text)
        try:
            pipeline.run_recipe(ws["target"], workspace, recipe=path, data=data)
        except Ran as e:
            return f"ran {e}"
        except SpecdraftError as e:
            return str(e)
        raise AssertionError("no stage ran")

    assert recipe(recipe_text) == "ran capture"           # the same settings: prepare is skipped
    said = recipe(recipe_text, data="self:6")
    assert "prepare.json: field 'source' is \"builtin\"" in said and "pass --conversations builtin" in said, said
    said = recipe(recipe_text.replace("samples: 6", "samples: 12"))
    assert "field 'limit' is 6" in said and "samples: 6" in said, said
    said = recipe(recipe_text.replace("max_new_tokens: 12", "max_new_tokens: 64"))
    assert "field 'regeneration.max_new_tokens' is 12" in said, said
    shutil.copy(ws["root"] / "vocab.safetensors", workspace / "vocab.safetensors")    # 32 entries
    said = recipe(recipe_text.replace("draft_vocab: 32", "draft_vocab: 64"))
    assert "vocab.safetensors: draft_vocab_size is 32" in said and "draft_vocab: 32" in said, said
