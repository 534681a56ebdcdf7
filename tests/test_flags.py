"""One meaning per flag (issue 16): inputs named by kind (--conversations, --prepared, --store), one
draft-length name (--num-speculative-tokens / -k, vLLM's num_speculative_tokens), --json prints to
stdout and --out writes, --version. Every old name still works for one release and says so in one
line on stderr. The stages themselves are replaced by recorders: this is about the command line."""

import json

import pytest
from typer.testing import CliRunner

from specdraft import __version__
from specdraft.cli import app

NOTE = "is deprecated, use"


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
                                                              "accept_len_by_k": [1.0, 1.5]}))
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


# (new argv, old argv, stage, how to read the value the stage got, the value)
def cases(tmp):
    ws = tmp / "ws"
    return [
        (["prepare", "--engine", "hf", "--out", ws / "d1", "--conversations", "builtin"],
         ["prepare", "--engine", "hf", "--out", ws / "d2", "--data", "builtin"], "prepare", ("source",), "builtin"),
        (["capture", "--engine", "hf", "--out", ws / "h1", "--prepared", ws / "data"],
         ["capture", "--engine", "hf", "--out", ws / "h2", "--data", ws / "data"], "capture", ("data",), ws / "data"),
        (["vocab", "build", "--size", "2", "--out", ws / "v.st", "--prepared", ws / "data"],
         ["vocab", "build", "--size", "2", "--out", ws / "v.st", "--data", ws / "data"], "vocab", (None, 0), ws / "data"),
        (["probe", "--vocab", "a", "--vocab", "b", "--prepared", ws / "data"],
         ["probe", "--vocab", "a", "--vocab", "b", "--data", ws / "data"], "probe", ("data",), ws / "data"),
        (["plan", "--accept", "0.5", "--json", "--store", ws / "hidden"],
         ["plan", "--accept", "0.5", "--json", "--data", ws / "hidden"], "plan", ("data",), ws / "hidden"),
        (["plan", "--accept", "0.5", "--json", "-k", "5"],
         ["plan", "--accept", "0.5", "--json", "--k-max", "5"], "plan", ("k_max",), 5),
        (["eval", "--drafter", "d", "--store", ws / "hidden"],
         ["eval", "--drafter", "d", "--data", ws / "hidden"], "eval", (None, 1), ws / "hidden"),
        (["recipe", "smollm2", "--engine", "hf", "--conversations", "c.jsonl"],
         ["recipe", "smollm2", "--engine", "hf", "--data", "c.jsonl"], "recipe", ("data",), "c.jsonl"),
        (["export", ws / "run", "--json", "--out", ws / "e1", "--num-speculative-tokens", "5"],
         ["export", ws / "run", "--json", "--out", ws / "e2", "--speculative-tokens", "5"], "export", ("speculative_tokens",), 5),
        (["train", "--online", "--engine", "hf", "--prepared", ws / "data"],
         ["train", "--online", "--engine", "hf", "--data", ws / "data"], "online", (None, 0), str(ws / "data")),
    ]


def test_new_names_and_old_ones_reach_the_stage_alike(calls, tmp_path):
    for new, old, stage, where, want in cases(tmp_path):
        for argv, deprecated in ((new, False), (old, True)):
            calls.clear()
            res = invoke(*argv)
            assert res.exit_code == 0, (argv, res.output, res.exception)
            assert value(calls[stage], where[0], *where[1:]) == want, (argv, calls[stage])
            notes = [line for line in res.stderr.splitlines() if NOTE in line]
            assert len(notes) == (1 if deprecated else 0), (argv, res.stderr)
            if deprecated:
                assert notes[0].startswith("note: " + next(a for a in old if str(a).startswith("-") and a not in new)), notes


def test_old_k_names_give_the_new_name_in_errors():
    """generate and bench load a model before running; a bad -k is refused before that, by its new name."""
    for cmd in (["generate", "--prompt", "hi", "--method", "ngram"], ["bench", "--methods", "greedy"]):
        for flag in ("-k", "--num-speculative-tokens", "--k"):
            res = invoke(*cmd, flag, "0")
            assert res.exit_code != 0 and "--num-speculative-tokens 0" in str(res.exception), (flag, res.output)
            assert (NOTE in res.stderr) == (flag == "--k"), res.stderr


def test_json_prints_and_out_writes(calls, tmp_path):
    res = invoke("eval", "--drafter", "d", "--store", tmp_path, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["accept_len"] == 1.5, res.output
    res = invoke("eval", "--drafter", "d", "--store", tmp_path, "--out", tmp_path / "e.json")
    assert res.exit_code == 0 and json.loads((tmp_path / "e.json").read_text())["accept_len"] == 1.5
    assert "accept_len   1.500" in res.stdout
    # the old `--json PATH` still writes PATH for one release, with the note
    res = invoke("eval", "--drafter", "d", "--store", tmp_path, "--json", tmp_path / "old.json")
    assert res.exit_code == 0 and (tmp_path / "old.json").is_file(), res.output
    assert f"--json PATH is deprecated, use --out {tmp_path / 'old.json'}" in res.stderr
    res = invoke("eval", "--drafter", "d", "--store", tmp_path, "a", "b")
    assert res.exit_code != 0 and "unexpected argument" in str(res.exception)


def test_both_names_at_once_and_missing_inputs_are_one_line(calls, tmp_path):
    res = invoke("eval", "--drafter", "d", "--store", tmp_path, "--data", tmp_path)
    assert "--data and --store: the same option" in str(res.exception)
    res = invoke("eval", "--drafter", "d")
    assert "--store is required" in str(res.exception)
    res = invoke("vocab", "build", "--size", "2", "--out", tmp_path / "v", "--prepared", tmp_path, "--store", tmp_path)
    assert "pick one" in str(res.exception)
    res = invoke("vocab", "build", "--size", "2", "--out", tmp_path / "v", "--store", tmp_path / "h")
    assert res.exit_code == 0 and calls["vocab"][1]["kind"] == "store"


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
    for words, group in (((), cli.app), (("vocab",), cli.vocab_app), (("journal",), cli.journal_app)):
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
    from specdraft import cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    options = numeric_options()
    assert {o[1] for o in options} <= set(cli.NUMBER_BOUNDS), "a numeric option without bounds in cli.NUMBER_BOUNDS"
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
    for flag in ("--nproc", "--tensor-parallel-size"):   # the launcher's, bounded in cli.NUMBER_BOUNDS
        assert one_line_refusal(monkeypatch, capsys, ["train", flag, 0]).startswith(f"error: {flag} 0: must be 1..")
    line = one_line_refusal(monkeypatch, capsys, ["train", "--epochs", 10**12])
    assert "--epochs 1000000000000: must be 1..100000" in line
    assert not calls, calls
