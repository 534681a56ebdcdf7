"""One meaning per flag (issues 16 and 28): inputs named by kind (--conversations, --prepared, --store),
one draft length (-k / --num-speculative-tokens, vLLM's num_speculative_tokens) with one default,
--json prints to stdout and --out writes, each flag's help the same meaning in every command, --help
in 80 columns, and neighbouring tools' flag names answered with ours. The stages themselves are
replaced by recorders: this is about the command line."""

import json

import pytest
from typer.testing import CliRunner

from specdraft import __version__
from specdraft.cli import app
from specdraft.defaults import DRAFT_LENGTH
from specdraft.errors import SpecdraftError


@pytest.fixture
def calls(monkeypatch):
    """Record what each stage is called with instead of running it."""
    import specdraft.analysis.evaluate as evaluate
    import specdraft.analysis.plan as plan
    import specdraft.analysis.probe as probe
    import specdraft.data.capture as capture
    import specdraft.data.prepare as prepare
    import specdraft.formats.checkpoints as formats
    import specdraft.pipeline as pipeline
    import specdraft.train.command as command
    import specdraft.train.online as online
    import specdraft.vocab as vocab

    seen = {}

    def record(name, result):
        def stage(*args, **kwargs):
            seen[name] = (args, kwargs)
            return result
        return stage

    monkeypatch.setattr(prepare, "prepare", record("prepare", {"counts": {"samples": 1, "tokens": 2, "loss_tokens": 1,
                                                                          "dropped": {}}}))
    monkeypatch.setattr(capture, "capture", record("capture", {"num_samples": 1, "num_tokens": 2, "shards": []}))
    monkeypatch.setattr(vocab, "build_from_data", record("vocab", {"draft_vocab_size": 2, "target_vocab_size": 4,
                                                                   "coverage": 1.0}))
    monkeypatch.setattr(probe, "run", record("probe", []))
    monkeypatch.setattr(plan, "run", record("plan", {"best_k": 3}))
    monkeypatch.setattr(evaluate, "evaluate", record("eval", {"split": "all", "cond_acc": [0.5], "accept_len": 1.5,
                                                              "accept_len_by_k": [1.0, 1.5], "k": 1, "warnings": []}))
    monkeypatch.setattr(pipeline, "run_recipe", record("recipe", {}))
    monkeypatch.setattr(formats, "export", record("export", {"source": "s", "source_layout": "ours", "has_embed_tokens": True}))
    monkeypatch.setattr(online, "online_setup", record("online", None))
    monkeypatch.setattr(command, "run", record("train", None))
    return seen


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def value(call, name, position=None):
    args, kwargs = call
    return kwargs[name] if position is None else args[position]


# (argv, stage, how to read the value the stage got, the value)
def cases(tmp):
    ws = tmp / "ws"
    return [
        (["prepare", "--engine", "hf", "--out", ws / "d1", "--conversations", "builtin"], "prepare", ("source",), "builtin"),
        (["capture", "--engine", "hf", "--out", ws / "h1", "--prepared", ws / "data"], "capture", ("data",), ws / "data"),
        (["capture", "--engine", "hf", "--out", ws / "h2", "--prepared", ws / "data", "--store-dtype", "float16"],
         "capture", ("dtype",), "float16"),
        (["vocab", "build", "--size", "2", "--out", ws / "v.st", "--prepared", ws / "data"], "vocab", (None, 0), ws / "data"),
        (["probe", "--vocab", "a", "--vocab", "b", "--prepared", ws / "data"], "probe", ("data",), ws / "data"),
        (["probe", "--vocab", "a", "--vocab", "b", "-k", "3", "--tokens-per-sample", "64"], "probe", ("steps",), 3),
        (["probe", "--vocab", "a", "--vocab", "b"], "probe", ("steps",), DRAFT_LENGTH),
        (["plan", "--accept", "0.5", "--json", "--store", ws / "hidden"], "plan", ("data",), ws / "hidden"),
        (["plan", "--accept", "0.5", "--json", "--max-k", "5"], "plan", ("k_max",), 5),
        (["eval", "--drafter", "d", "--store", ws / "hidden"], "eval", (None, 1), ws / "hidden"),
        (["eval", "--drafter", "d", "--store", ws / "hidden"], "eval", ("steps",), DRAFT_LENGTH),
        (["eval", "--drafter", "d", "--store", ws / "hidden", "-k", "3"], "eval", ("steps",), 3),
        (["recipe", "default", "--engine", "hf", "--conversations", "c.jsonl"], "recipe", ("data",), "c.jsonl"),
        (["recipe", "default", "--engine", "hf"], "recipe", (None, 1), __import__("pathlib").Path("ws/default-quick")),
        (["export", ws / "run", "--json", "--out", ws / "e1", "-k", "5"], "export", ("speculative_tokens",), 5),
        # no -k: export writes DRAFT_LENGTH, or less for a drafter trained to draft less (formats.draft_length)
        (["export", ws / "run", "--json", "--out", ws / "e2"], "export", ("speculative_tokens",), None),
        (["export", ws / "run", "--json", "--out", ws / "e3", "--weights-dtype", "float16"], "export", ("dtype",), "float16"),
        (["train", "--online", "--engine", "hf", "--prepared", ws / "data", "--out", ws / "r", "--vocab", "v"],
         "online", (None, 0), str(ws / "data")),
        (["train", "--online", "--engine", "hf", "-tp", "1", "--prepared", ws / "data", "--out", ws / "r2",
          "--vocab", "v"], "online", (None, 0), str(ws / "data")),
    ]


def test_each_name_reaches_the_stage(calls, tmp_path):
    for argv, stage, where, want in cases(tmp_path):
        calls.clear()
        res = invoke(*argv)
        assert res.exit_code == 0, (argv, res.output, res.exception)
        assert value(calls[stage], where[0], *where[1:]) == want, (argv, calls[stage])


def test_old_names_are_gone_and_neighbouring_tools_names_get_ours(calls, tmp_path):
    """0.1.0 was never released: the deprecated aliases are removed (issue 28). A flag name from
    SpecForge/speculators/vLLM, or one of our old ones, is answered with ours where the command has it."""
    ws = tmp_path / "ws"
    for argv, ours in ((["train", "--output-dir", ws / "r"], "--out"), (["train", "--learning-rate", "1e-3"], "--lr"),
                       (["train", "--num-epochs", "3"], "--epochs"), (["export", ws, "--output-dir", ws / "e"], "--out"),
                       (["capture", "--data", ws, "--out", ws / "h"], "--prepared"),
                       (["capture", "--dtype", "float16", "--out", ws / "h"], "--store-dtype"),
                       (["bench", "--dtype", "float16"], "--compute-dtype"),
                       (["export", ws, "--dtype", "float16", "--out", ws / "e"], "--weights-dtype"),
                       (["bench", "--profile"], "--time-split"), (["eval", "--steps", "3"], "-k"),
                       (["probe", "--max-tokens", "3"], "--tokens-per-sample"), (["plan", "--k-max", "3"], "--max-k"),
                       (["prepare", "--tp", "2"], "-tp")):
        res = invoke(*argv)
        assert res.exit_code == 2 and "No such option" in res.output and ours in res.output, (argv, res.output)
    assert not calls


def test_flags_that_live_elsewhere_name_where_not_a_lookalike(calls, tmp_path):
    """Issue 36: train --draft-vocab-size suggested --draft-layers and prepare --chat-template
    suggested --temperature. A neighbouring tool's flag whose setting lives in another command says
    where it lives."""
    ws = tmp_path / "ws"
    res = invoke("train", "--draft-vocab-size", "8192", "--out", ws / "r")
    assert res.exit_code == 2 and "specdraft vocab build --size N" in res.output, res.output
    assert "--draft-layers" not in res.output
    res = invoke("prepare", "--chat-template", "t.jinja", "--out", ws / "d")
    assert res.exit_code == 2 and "the target's own chat template" in res.output, res.output
    assert "--temperature" not in res.output
    assert not calls


def test_generate_errors_name_its_own_method_flag(tiny_target, tmp_path):
    """generate's flag is --method; its errors said --methods (bench's)."""
    from specdraft.infer.methods import check_drafter_methods, untrained_drafter
    from specdraft.targets import load_target

    with pytest.raises(SpecdraftError, match=r"^--method eagle3: needs --drafter"):
        check_drafter_methods(["eagle3"], None, "--method")
    drafter = untrained_drafter(load_target(str(tiny_target)).model, draft_vocab_size=16)
    with pytest.raises(SpecdraftError, match=r"^--method peagle: the --drafter is a eagle3 drafter; name it "
                                             r"--method eagle3$"):
        check_drafter_methods(["peagle"], drafter, "--method")
    res = invoke("generate", "--prompt", "hi", "--model", tiny_target)       # the CLI itself (main: exit 2)
    assert isinstance(res.exception, SpecdraftError) and str(res.exception).startswith("--method eagle3: needs")


def test_json_prints_and_out_writes(calls, tmp_path):
    res = invoke("eval", "--drafter", "d", "--store", tmp_path, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["accept_len"] == 1.5, res.output
    res = invoke("eval", "--drafter", "d", "--store", tmp_path, "--out", tmp_path / "e.json")
    assert res.exit_code == 0 and json.loads((tmp_path / "e.json").read_text())["accept_len"] == 1.5
    assert "τ 1.500 at K=1 on" in res.stdout
    res = invoke("eval", "--drafter", "d", "--store", tmp_path, "--json", tmp_path / "old.json")
    assert res.exit_code != 0 and not (tmp_path / "old.json").exists(), res.output


def test_missing_inputs_are_one_line(calls, tmp_path):
    res = invoke("eval", "--drafter", "d")
    assert res.exit_code == 2 and "Missing option '--store'" in res.output
    res = invoke("vocab", "build", "--size", "2", "--out", tmp_path / "v", "--prepared", tmp_path, "--store", tmp_path)
    assert "pick one" in str(res.exception)
    res = invoke("vocab", "build", "--size", "2", "--out", tmp_path / "v", "--store", tmp_path / "h")
    assert res.exit_code == 0 and calls["vocab"][1]["kind"] == "store"
    res = invoke("train", "--vocab", "v.safetensors")
    assert "train: --out (the run folder), --store (the hidden-state store) required" in str(res.exception)
    assert "train" not in calls


def all_flag_helps() -> dict:
    """{flag name: {command: help}} over every sub-command, train's generated options included."""
    import typer

    helps = {}

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
            return
        for param in cmd.params:
            for name in (*param.opts, *param.secondary_opts):
                if name.startswith("-") and not getattr(param, "hidden", False):
                    helps.setdefault(name, {})[" ".join(path)] = param.help or ""
    walk(typer.main.get_command(app), [])
    return helps


def meanings(helps: dict) -> dict:
    """A help's meaning: its text before " Here: " (what is particular to the one command)."""
    return {flag: {cmd: text.split(" Here: ")[0] for cmd, text in by_cmd.items()} for flag, by_cmd in helps.items()}


def test_each_flag_has_one_meaning_in_every_command():
    """--dtype was the stored dtype in capture, the compute dtype in bench and the weights' in export."""
    helps = all_flag_helps()
    assert len(helps) > 60 and {"--store-dtype", "--compute-dtype", "--weights-dtype", "-k", "-tp"} <= set(helps)
    assert "--dtype" not in helps and "--steps" not in helps
    several = {flag: set(by_cmd.values()) for flag, by_cmd in meanings(helps).items() if len(set(by_cmd.values())) > 1}
    assert not several, several
    assert all(text for by_cmd in helps.values() for text in by_cmd.values()), "a flag without help"
    # the check itself: the old --dtype's three helps are three meanings
    old = {"capture": "Stored dtype: bfloat16, float16 or float32.", "bench": "float32, bfloat16 or float16.",
           "export": "Weights dtype: bfloat16 (what vLLM/SGLang serve), float16 or float32."}
    assert len(set(meanings({"--dtype": old})["--dtype"].values())) == 3


def test_help_fits_80_columns_shows_no_python_types_and_marks_required():
    import re

    import typer

    root = typer.main.get_command(app)
    commands = [[]] + [[n] for n in root.commands if not hasattr(root.commands[n], "commands")] + [
        [g, n] for g in root.commands if hasattr(root.commands[g], "commands") for n in root.commands[g].commands]
    for words in commands:
        res = CliRunner().invoke(app, [*words, "--help"], terminal_width=80)
        assert res.exit_code == 0, (words, res.output)
        wide = [line for line in res.output.splitlines() if len(line) > 80]
        assert not wide, (words, wide)
        assert not re.search(r"<(bool|str|int|float|path|list\[)", res.output), (words, res.output)
        assert "…" not in res.output, words
    for words, flag in ((["prepare"], "--conversations"), (["eval"], "--store"), (["store", "convert"], "--out")):
        text = " ".join(CliRunner().invoke(app, [*words, "--help"], terminal_width=80).output.split())
        assert re.search(re.escape(flag) + r" \S+ (?:(?! --).)*?\[required\]", text), (words, text)
    res = CliRunner().invoke(app, ["vocab", "diff", "--help"])
    assert "--out" not in res.output
    res = CliRunner().invoke(app, ["--help"])
    listed = [line.split()[0] for line in res.output.split("Commands:")[1].splitlines() if line.startswith("  ")]
    assert listed[:8] == ["info", "prepare", "capture", "store", "vocab", "train", "eval", "bench"], listed


def test_version():
    res = invoke("--version")
    assert res.exit_code == 0 and res.stdout.strip() == f"specdraft {__version__}"


# ----------------------------------------------------------------------------- numbers at their limits (issue 25)

def numeric_options():
    """(command words, parameter name, flag, is_int, required argv) of every int/float option of every
    command, read from the commands' signatures; train's settings come from RunConfig."""
    import inspect
    import typing

    from specdraft import cli

    found = []
    for words, group in (((), cli.app), (("vocab",), cli.vocab_app), (("journal",), cli.journal_app),
                         (("store",), cli.store_app)):
        for info in group.registered_commands:
            fn = inspect.unwrap(info.callback)
            name = info.name or fn.__name__
            if name == "train":
                continue
            hints = typing.get_type_hints(fn)
            params = inspect.signature(fn).parameters
            required = []
            for pname, p in params.items():
                d = p.default
                if getattr(d, "default", None) is ... :
                    decls = getattr(d, "param_decls", ()) or ()
                    if type(d).__name__ == "ArgumentInfo":
                        required.append("x")
                    else:
                        required += [decls[0] if decls else "--" + pname.replace("_", "-"),
                                     "1" if hints[pname] is int else "x"]
            for pname, p in params.items():
                if hints.get(pname) in (int, float, typing.Optional[int], typing.Optional[float]):
                    decls = getattr(p.default, "param_decls", ()) or ()
                    flag = decls[0] if decls else "--" + pname.replace("_", "-")
                    found.append(((*words, name), pname, flag, int in typing.get_args(hints[pname]) or
                                  hints[pname] is int, required))
    return found


def one_line_refusal(monkeypatch, capsys, argv):
    import sys

    from specdraft import cli

    monkeypatch.setattr(sys, "argv", ["specdraft", *map(str, argv)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, err)
    return lines[0]


def test_every_numeric_option_is_bounded_and_refused_before_any_work(monkeypatch, capsys, calls):
    """`--limit -1` kept all prompts but the last; `--seed 2**70` overflowed torch.manual_seed once the
    model had loaded. Each int option of every command gets -1 and 2**70, each float one nan, inf and
    -1: one line naming the option, exit 2, and no stage ran (they are recorders here)."""
    from specdraft.flags import NUMBER_BOUNDS

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    options = numeric_options()
    assert {o[1] for o in options} <= set(NUMBER_BOUNDS), "a numeric option without bounds in flags.NUMBER_BOUNDS"
    assert len(options) >= 30
    for words, name, flag, is_int, required in options:
        for bad in ([-1, 2**70] if is_int else ["nan", "inf", -1]):
            argv = [*words, *required]
            if flag in argv:   # a required number (vocab build --size): replace its placeholder
                i = argv.index(flag)
                del argv[i:i + 2]
            line = one_line_refusal(monkeypatch, capsys, [*argv, flag, bad])
            shown = {"nan": "nan", "inf": "inf"}.get(bad, str(float(bad)) if not is_int else str(bad))
            assert line.startswith(f"error: {flag} {shown}: must be"), (words, flag, line)
    assert not calls, calls


def test_train_settings_at_their_limits_are_refused_before_any_work(monkeypatch, capsys, calls):
    import dataclasses
    import typing

    from specdraft.train.config import RunConfig

    hints = typing.get_type_hints(RunConfig)
    ints = [f.name for f in dataclasses.fields(RunConfig) if hints[f.name] is int]
    assert {"seed", "epochs", "max_tokens", "warmup_steps"} <= set(ints)
    for name in ints:
        flag = "--" + name.replace("_", "-")
        for bad in (-1, 2**70):
            line = one_line_refusal(monkeypatch, capsys, ["train", flag, bad])
            assert line.startswith(f"error: {flag} {bad}: must be"), line
    for flag in ("--nproc", "--tensor-parallel-size"):   # the launcher's, bounded in flags.NUMBER_BOUNDS
        assert one_line_refusal(monkeypatch, capsys, ["train", flag, 0]).startswith(f"error: {flag} 0: must be 1..")
    line = one_line_refusal(monkeypatch, capsys, ["train", "--epochs", 10**12])
    assert "--epochs 1000000000000: must be 1..100000" in line
    assert not calls, calls


def test_an_error_line_is_printed_as_written(monkeypatch, capsys, tmp_path):
    """rich read `builtin:x:` as the :x: emoji and `[bold]` as markup in the one error line."""
    name = "[bold]a[/]:x:.jsonl"
    line = one_line_refusal(monkeypatch, capsys, ["prepare", "--conversations", name, "--out", tmp_path / "o"])
    assert line.startswith(f"error: {name}: data file not found"), line
