"""Output folders are owned: one writer at a time (a lock naming its pid), train never mixes two
runs in one folder, export/import never replace a training checkpoint or a store, and outputs
are readable by other users (normal umask)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bad_workspace import check_refusal, copy, run_cli, ws  # noqa: F401  (ws is a fixture)
from specdraft.errors import SpecdraftError

SMALL = ["--max-tokens", "64", "--precision", "fp32", "--no-progress"]


def train_args(ws, out, *extra) -> list:
    return ["train", "--store", ws["root"] / "hidden", "--vocab", ws["root"] / "vocab.safetensors",
            "--model", ws["target"], "--out", out, *SMALL, *extra]


@pytest.fixture(scope="module")
def run(ws):
    """A finished 2-epoch run (metrics.jsonl, config.yaml, best/, checkpoints/epoch-1 and -2)."""
    from specdraft.train.config import RunConfig
    from specdraft.train.loop import train

    out = ws["root"] / "finished-run"
    train(RunConfig(out=str(out), store=str(ws["root"] / "hidden"), vocab=str(ws["root"] / "vocab.safetensors"),
                    model=ws["target"], epochs=2, max_tokens=64, val_fraction=0.2, precision="fp32",
                    progress=False))
    assert (out / "best").is_dir() and (out / "checkpoints" / "epoch-2").is_dir()
    return out


class Holder:
    """Another specdraft process holding `folder` (outputs.own_folder) until the block ends."""

    def __init__(self, folder: Path, command: str):
        code = ("import sys; from specdraft.outputs import own_folder\n"
                f"with own_folder({str(folder)!r}, {command!r}):\n"
                "    print('held', flush=True); sys.stdin.read()\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})

    def __enter__(self) -> int:
        assert self.proc.stdout.readline().strip() == "held"
        return self.proc.pid

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# ----------------------------------------------------------------------------- the lock

def test_own_folder_is_exclusive_and_leaves_nothing_behind(tmp_path):
    from specdraft.outputs import LOCK_NAME, own_folder

    folder = tmp_path / "out"
    with own_folder(folder, "capture"):
        assert (folder / LOCK_NAME).read_text() == f"{os.getpid()} capture\n"
        # flock locks belong to an open file: a second open in this very process conflicts too
        with pytest.raises(SpecdraftError, match=rf"out: in use by another specdraft process \(pid {os.getpid()}, capture\)"):
            with own_folder(folder, "train"):
                pass
    assert not folder.exists()       # created for nothing: removed again
    folder.mkdir()
    (folder / "kept.txt").write_text("x")
    with own_folder(folder, "train"):
        pass
    assert sorted(p.name for p in folder.iterdir()) == ["kept.txt"]   # the lock file goes with the holder


def test_second_capture_into_a_held_folder_is_refused(ws, monkeypatch, capsys):
    folder = ws["root"] / "h-held"
    folder.mkdir()
    with Holder(folder, "capture") as pid:
        line = check_refusal(ws, monkeypatch, capsys, lambda ws: (
            ["capture", "--model", ws["target"], "--prepared", ws["root"] / "data", "--out", folder,
             "--layers", "2,4,5", "--store-dtype", "float32"], folder), f"in use by another specdraft process (pid {pid}, capture)")
    assert "choose another --out" in line
    assert list(folder.iterdir()) == []     # the holder's lock file left with it


def test_second_train_into_a_held_run_is_refused(ws, monkeypatch, capsys):
    folder = ws["root"] / "run-held"
    folder.mkdir()
    with Holder(folder, "train") as pid:
        check_refusal(ws, monkeypatch, capsys, lambda ws: (train_args(ws, folder, "--epochs", "1"), folder),
                      f"in use by another specdraft process (pid {pid}, train)")
    assert list(folder.iterdir()) == []


# ----------------------------------------------------------------------------- train: one run per folder

def test_train_into_an_existing_run_without_resume_is_refused(ws, run, monkeypatch, capsys):
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (train_args(ws, run, "--epochs", "1"), run),
                         "already holds a run")
    assert "metrics.jsonl" in line and "checkpoints/" in line and "--resume" in line and "--overwrite" in line


def test_a_run_that_died_before_its_first_checkpoint_is_told_to_overwrite_both_ways(ws, run, monkeypatch, capsys):
    """Issue 36: a run killed in its first epoch (--save-every 0) looped: --resume said "no checkpoint,
    start without --resume", and without it "already holds a run ... pass --resume or --overwrite".
    Both now say --overwrite, the one way forward."""
    import shutil

    died = ws["root"] / "died-early"
    died.mkdir(exist_ok=True)
    for name in ("config.yaml", "metrics.jsonl"):
        shutil.copy(run / name, died / name)
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (train_args(ws, died, "--resume"), died),
                         "no checkpoint to resume from: the run stopped before its first one")
    assert "--overwrite" in line and "start without --resume" not in line
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (train_args(ws, died, "--epochs", "1"), died),
                         "already holds a run that stopped before its first checkpoint")
    assert "pass --overwrite" in line and "pass --resume" not in line


def test_resume_and_overwrite_together_are_refused(ws, run, monkeypatch, capsys):
    check_refusal(ws, monkeypatch, capsys, lambda ws: (train_args(ws, run, "--resume", "--overwrite"), run),
                  "--resume and --overwrite")


def test_train_overwrite_starts_the_run_over(ws, run, monkeypatch, capsys):
    import yaml

    from specdraft.journal import read

    out = copy(ws, run.name, "overwritten-run")
    code, err, _ = run_cli(monkeypatch, capsys, train_args(ws, out, "--epochs", "1", "--val-fraction", "0",
                                                           "--overwrite"))
    assert code == 0, err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch-1"]   # no stale epoch-2
    assert not (out / "best").exists()       # no validation in the new run: the old best/ is gone
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["epochs"] == 1 and saved["overwrite"] is False   # a later --resume must not wipe it
    assert {rec.split('"split": ')[1][:7] for rec in (out / "metrics.jsonl").read_text().splitlines()} == {'"train"'}
    assert [e.text.split(":")[0] for e in read(out) if e.kind == "decision"] == ["started from scratch"]


def test_overwrite_refused_by_a_tracker_leaves_the_old_run_intact(ws, run, monkeypatch, capsys):
    """wandb without a login refuses at start: the old run (tensorboard folder included) is put back."""
    import wandb

    from specdraft.train.run_folder import SET_ASIDE

    out = copy(ws, run.name, "overwrite-no-login")
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "events.old").write_text("old events")

    def no_login(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", no_login)
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (
        train_args(ws, out, "--epochs", "1", "--overwrite", "--report-to", "tensorboard,wandb"), out), "No API key")
    assert "wandb login" in line and not (out / SET_ASIDE).exists()


def test_overwrite_killed_while_trackers_start_is_restored_next_time(ws, run, monkeypatch, capsys):
    from specdraft.train.run_folder import SET_ASIDE

    out = copy(ws, run.name, "overwrite-killed")
    aside = out / SET_ASIDE
    aside.mkdir()
    for name in ("metrics.jsonl", "config.yaml", "checkpoints", "best"):
        (out / name).rename(aside / name)
    (out / "tensorboard").mkdir()           # what the killed start's tracker made
    code, err, _ = run_cli(monkeypatch, capsys, train_args(ws, out, "--epochs", "1"))
    assert code == 2 and "restored the previous run" in err and "already holds a run" in err, err
    assert not aside.exists() and not (out / "tensorboard").exists()
    assert (out / "checkpoints" / "epoch-2").is_dir() and (out / "metrics.jsonl").is_file()


def test_resume_with_other_settings_is_refused_with_each_difference(ws, run, monkeypatch, capsys):
    """The restored optimizer keeps lr 1e-4 / weight decay 0.01: new values would only be written to
    config.yaml, so they are refused, each named old -> new."""
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (
        train_args(ws, run, "--resume", "--lr", "0.05", "--weight-decay", "0.5", "--epochs", "3"), run),
        "these differ")
    assert "--lr 0.0001 -> 0.05" in line and "--weight-decay 0.01 -> 0.5" in line, line
    assert "--epochs" not in line and "start a new run in another --out" in line   # --epochs 3 is applied
    print(f"\n{line}")


@pytest.mark.parametrize("damage, phrase", [
    (lambda run: (run / "config.yaml").unlink(), "config.yaml: not found"),
    (lambda run: (run / "config.yaml").write_text("lr: [1, 2\n"), "not valid YAML"),
    (lambda run: (run / "config.yaml").write_text("seed: seven\n"), "seed is 'seven'"),
    (lambda run: (run / "checkpoints" / "epoch-2" / "progress.json").write_text("{\"step\": "),
     "epoch-2/progress.json: no whole-number step"),
    (lambda run: (run / "checkpoints" / "epoch-2" / "progress.json").unlink(), "epoch-2/progress.json: not found"),
], ids=["config.yaml missing", "config.yaml not YAML", "config.yaml wrong type", "progress.json cut",
        "progress.json missing"])
def test_resume_with_a_missing_or_damaged_record_is_refused(ws, run, monkeypatch, capsys, damage, phrase):
    out = copy(ws, run.name, "resume-damaged")
    damage(out)
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (train_args(ws, out, "--resume"), out), phrase)
    assert "resume" in line or "delete" in line, line
    print(f"\n{line}")


def test_recipe_continues_a_started_run_with_the_right_flag(tmp_path):
    from specdraft.pipeline import _continue_run

    run = tmp_path / "run"
    assert _continue_run(run) == []
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    assert _continue_run(run) == ["--overwrite"]      # killed before its first checkpoint
    ckpt = run / "checkpoints" / "step-4"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    (ckpt / "progress.json").write_text("{}")
    assert _continue_run(run) == ["--resume"]


# ----------------------------------------------------------------------------- export / import

def test_export_onto_a_training_checkpoint_is_refused(ws, run, monkeypatch, capsys):
    epoch = run / "checkpoints" / "epoch-1"
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (["export", ws["root"] / "drafter", "--out", epoch], epoch),
                         "holds a training checkpoint")
    assert "trainer_state.pt" in line and "choose an empty or new --out" in line
    assert (epoch / "trainer_state.pt").is_file() and (epoch / "progress.json").is_file()


def test_export_onto_a_run_folder_is_refused(ws, run, monkeypatch, capsys):
    check_refusal(ws, monkeypatch, capsys, lambda ws: (["export", ws["root"] / "drafter", "--out", run], run),
                  "holds a training run")


def test_import_onto_a_store_is_refused(ws, monkeypatch, capsys):
    store = ws["root"] / "hidden"
    check_refusal(ws, monkeypatch, capsys, lambda ws: (["import", ws["root"] / "drafter", "--out", store], store),
                  "holds a hidden-state store")


def test_export_replaces_an_earlier_export_readable_by_everyone(ws, monkeypatch, capsys):
    out = ws["root"] / "export-shared"
    old = os.umask(0o022)
    try:
        for _ in range(2):     # the second export replaces the first
            code, err, _ = run_cli(monkeypatch, capsys, ["export", ws["root"] / "drafter", "--out", out])
            assert code == 0, err
    finally:
        os.umask(old)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "export.json",   # + card, record
                                                    "model.safetensors"]
    assert out.stat().st_mode & 0o777 == 0o755
    for f in out.iterdir():
        assert f.stat().st_mode & 0o777 == 0o644, f


# ----------------------------------------------------------------------------- single-file --out

def _victim(ws, name: str, text: str = '{"mine": true}\n') -> Path:
    path = ws["root"] / name
    path.write_text(text)
    return path


def _link(ws, name: str, to: Path) -> Path:
    link = ws["root"] / name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(to)
    return link


def o_vocab_onto_manifest(ws, run):
    store = ws["root"] / "hidden"
    return ["vocab", "build", "--store", store, "--size", "16", "--out", store / "manifest.json"], store


def o_eval_onto_metrics(ws, run):
    return ["eval", "--drafter", run, "--store", ws["root"] / "hidden", "--model", ws["target"], "--out",
            run / "metrics.jsonl"], run


def o_eval_onto_vocab(ws, run):
    return ["eval", "--drafter", run, "--store", ws["root"] / "hidden", "--model", ws["target"], "--out",
            ws["root"] / "vocab.safetensors"], ws["root"] / "vocab.safetensors"


def o_bench_onto_prompts(ws, run):
    prompts = _victim(ws, "prompts-in.jsonl", '{"messages": [{"role": "user", "content": "hi"}]}\n')
    return ["bench", "--model", ws["target"], "--methods", "greedy", "--prompts", prompts, "--out", prompts], prompts


def o_bench_chart_is_a_link(ws, run):
    victim = _victim(ws, "victim-chart.txt", "not a chart")
    _link(ws, "bench-linked.png", victim)
    return ["bench", "--model", ws["target"], "--methods", "greedy", "--out", ws["root"] / "bench-linked.json"], victim


def o_remap_onto_its_input(ws, run):
    vocab = ws["root"] / "vocab.safetensors"
    return ["vocab", "remap", vocab, ws["root"] / "drafter", "--out", vocab], vocab


def o_plan_onto_its_accept_file(ws, run):
    accept = _victim(ws, "eval-accept.json", json.dumps({"cond_acc": [0.8, 0.6]}))
    return ["plan", "--accept", accept, "--verify-ms", "10", "--draft-ms", "1", "--out", accept], accept


def o_probe_onto_a_vocab(ws, run):
    vocab = ws["root"] / "vocab.safetensors"
    return ["probe", "--vocab", vocab, "--vocab", ws["root"] / "drafter", "--out", ws["root"] / "drafter" /
            "config.json"], ws["root"] / "drafter"


def o_report_onto_config(ws, run):
    return ["report", run, "--out", run / "config.yaml"], run


def o_eval_through_a_link(ws, run):
    victim = _victim(ws, "victim.json")
    link = _link(ws, "eval-link.json", victim)
    return ["eval", "--drafter", run, "--store", ws["root"] / "hidden", "--model", ws["target"], "--out", link], victim


OUT_CASES = [
    (o_vocab_onto_manifest, "manifest.json is a file specdraft"),
    (o_eval_onto_metrics, "metrics.jsonl is a file specdraft"),
    (o_eval_onto_vocab, "existing .safetensors file"),
    (o_bench_onto_prompts, "is also an input of this command"),
    (o_bench_chart_is_a_link, "bench-linked.png: is a symbolic link"),
    (o_remap_onto_its_input, "is also an input of this command"),
    (o_plan_onto_its_accept_file, "is also an input of this command"),
    (o_probe_onto_a_vocab, "config.json is a file specdraft"),
    (o_report_onto_config, "config.yaml is a file specdraft"),
    (o_eval_through_a_link, "is a symbolic link"),
]


@pytest.mark.parametrize("build, phrase", OUT_CASES, ids=[b.__name__[2:] for b, _ in OUT_CASES])
def test_single_file_out_never_replaces_an_input_or_an_owned_file(ws, run, monkeypatch, capsys, build, phrase):
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: build(ws, run), phrase)
    assert "choose another" in line or "remove the link" in line, line
    print(f"\n{line}")


def test_lock_file_planted_as_a_link_is_not_written_through(tmp_path):
    from specdraft.outputs import LOCK_NAME, own_folder

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK_NAME).symlink_to(victim)
    with pytest.raises(SpecdraftError, match="cannot create its lock file"):
        with own_folder(folder, "capture"):
            pass
    assert victim.read_text() == "precious"


# ----------------------------------------------------------------------------- eval --split val

def test_eval_val_split_on_another_store_is_refused(ws, run, monkeypatch, capsys):
    """The run's held-out samples exist only in its own store: on another store the same seed and
    fraction pick samples the run trained on, which were labelled "held-out samples of the run"."""
    from rich.console import Console

    from bad_workspace import conv, write_jsonl
    from specdraft.analysis.evaluate import evaluate
    from specdraft.data import capture as cap
    from specdraft.data.prepare import prepare

    root = ws["root"]
    if not (root / "h-other-samples" / "manifest.json").exists():
        src = write_jsonl(root / "other-samples.jsonl", [conv(f"other question {i}", f"reply {i} " * 3)
                                                        for i in range(6)])
        prepare(model=ws["target"], source=str(src), out=root / "d-other-samples",
                console=Console(stderr=True, quiet=True))
        cap.capture(model=ws["target"], data=root / "d-other-samples", out=root / "h-other-samples",
                    layers=[2, 4, 5], dtype="float32", shard_tokens=200, progress=False)
    other = root / "h-other-samples"
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (
        ["eval", "--drafter", run, "--store", other, "--model", ws["target"], "--split", "val"], other),
        "is not the store the run trained on")
    assert f"--store {root / 'hidden'}" in line and "--split all" in line, line
    print(f"\n{line}")
    # the run's own store keeps its held-out split; another store is fine with --split all
    assert "held-out samples of the run" in evaluate(run, root / "hidden", model=ws["target"], steps=2)["split"]
    # ... and says its samples are unseen (e.g. a store captured from the natural set's prompts)
    unseen = evaluate(run, other, model=ws["target"], split="all", steps=2)
    assert unseen["split"] == "all (6 samples of a store the run did not train on)", unseen["split"]
    assert unseen["split_name"] == "unseen-store", unseen
    assert not any("trained on" in w or "may include" in w for w in unseen["warnings"]), unseen["warnings"]


def test_eval_val_split_of_a_run_over_several_stores_names_a_fix_that_parses(tmp_path, monkeypatch):
    """A run trained with --store A --store B records "A + B"; the refusal on another store names the
    flags that read their union (`--store A --store B`), never "A + B", which does not parse."""
    from specdraft.analysis import evaluate as E

    monkeypatch.setattr(E, "store_mismatch", lambda *a: "its inputs.json records another fingerprint")
    monkeypatch.setattr(E, "trained_store_of", lambda checkpoint: ({"store": "ws/a + ws/b"}, "inputs.json"))
    with pytest.raises(SpecdraftError) as err:
        E.check_trained_store(tmp_path, None, "ws/c", {})
    line = str(err.value)
    assert "pass --store ws/a --store ws/b (the run's own" in line and "--split all" in line, line
    monkeypatch.setattr(E, "trained_store_of", lambda checkpoint: ({"store": "ws/a"}, "inputs.json"))
    with pytest.raises(SpecdraftError, match="pass --store ws/a [(]the run's own"):
        E.check_trained_store(tmp_path, None, "ws/c", {})


def test_eval_of_an_export_leaves_out_its_training_samples(ws, run, tmp_path):
    """Issue 36: the folder a user ships was scored on all the store's samples, its own training data
    included, with no word. The export carries the run's inputs.json and split, so eval of it uses the
    run's held-out samples; --split all says loudly that it includes them; a drafter of unknown origin
    gets a line that the samples may include its training data."""
    import shutil

    from specdraft.analysis.evaluate import evaluate, format_result
    from specdraft.data.store import HiddenStore
    from specdraft.formats.checkpoints import export

    export(run, tmp_path / "export", "speculators")
    inputs = json.loads((tmp_path / "export" / "inputs.json").read_text())
    assert inputs["val_fraction"] == 0.2 and inputs["seed"] == 0
    of_run = evaluate(run, ws["root"] / "hidden", model=ws["target"], steps=2)
    of_export = evaluate(tmp_path / "export", ws["root"] / "hidden", model=ws["target"], steps=2)
    assert of_export["split"] == of_run["split"] and "held-out samples of the run" in of_export["split"]
    total = len(HiddenStore(ws["root"] / "hidden"))
    assert of_export["samples"] == of_run["samples"] < total
    assert not any("trained on" in w or "may include" in w for w in of_export["warnings"])
    assert f"on {of_run['samples']} held-out store samples" in format_result(of_export)
    every = evaluate(tmp_path / "export", ws["root"] / "hidden", model=ws["target"], split="all", steps=2)
    assert "includes the samples the drafter trained on" in every["warnings"][0]
    assert "all store samples (training data included)" in format_result(every)
    bare = tmp_path / "bare"
    shutil.copytree(tmp_path / "export", bare)
    (bare / "inputs.json").unlink()
    unknown = evaluate(bare, ws["root"] / "hidden", model=ws["target"], steps=2)
    assert unknown["samples"] == total and "may include them" in unknown["warnings"][0]
    assert "may include the drafter's training data" in format_result(unknown)
