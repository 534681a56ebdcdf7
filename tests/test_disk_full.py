"""A full disk in every writer: one line naming the path (exit 2), no traceback, and what was
written before is intact.

The disk fills up by injection: every fsync of a file under the armed folder fails with ENOSPC,
which is where a full disk reports itself for files written through the page cache (every
writer fsyncs before it renames a file into place). safetensors reports I/O errors in its own
exception type; `test_safetensors_write_error_is_one_line` makes a real one with a file-size limit.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch

from bad_workspace import LAYERS, check_refusal, ws  # noqa: F401  (ws is a fixture)

PHRASE = "no space left on device (ENOSPC)"


@pytest.fixture
def full_disk(monkeypatch):
    """full_disk(folder): from now on, fsync of any file under `folder` fails with ENOSPC."""
    real_fsync = os.fsync

    def arm(folder: Path) -> None:
        root = str(Path(folder).resolve())

        def fsync(fd: int) -> None:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(root):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    return arm


def fresh(ws, name: str) -> Path:
    path = ws["root"] / name
    shutil.rmtree(path, ignore_errors=True)
    return path


def exported(ws) -> Path:
    from specdraft.formats.checkpoints import export

    out = ws["root"] / "export-ok"
    if not out.exists():
        export(ws["root"] / "drafter", out, "speculators")
    return out


def c_prepare(ws):
    out = fresh(ws, "data-full")
    return ["prepare", "--model", ws["target"], "--conversations", ws["root"] / "good.jsonl", "--out", out], None, out


def c_capture(ws):
    out = fresh(ws, "h-full")
    return (["capture", "--model", ws["target"], "--prepared", ws["root"] / "data", "--out", out, "--layers", LAYERS,
             "--store-dtype", "float32"], ws["root"] / "data", out)


def c_vocab_build(ws):
    out = ws["root"] / "vocab-full" / "vocab.safetensors"
    out.parent.mkdir(exist_ok=True)
    shutil.copy(ws["root"] / "vocab.safetensors", out)
    return ["vocab", "build", "--prepared", ws["root"] / "data", "--size", "16", "--out", out], out.parent, out.parent


def c_train(ws):
    out = fresh(ws, "run-full")
    return (["train", "--model", ws["target"], "--store", ws["root"] / "hidden", "--vocab",
             ws["root"] / "vocab.safetensors", "--out", out, "--no-progress", "--epochs", "1", "--max-tokens", "64",
             "--val-fraction", "0", "--precision", "fp32"], ws["root"] / "hidden", out)


def c_export_over_export(ws):
    out = exported(ws)
    return ["export", ws["root"] / "drafter", "--out", out, "--format", "sglang"], out, out.parent


def c_import(ws):
    out = fresh(ws, "import-full")
    return ["import", exported(ws), "--out", out], exported(ws), out.parent   # written beside, swapped in


def c_bench_json(ws):
    out = ws["root"] / "bench-full" / "bench.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text('{"old": true}\n')
    return (["bench", "--model", ws["target"], "--prompts", ws["root"] / "good.jsonl", "--methods", "greedy",
             "--max-new-tokens", "2", "--limit", "1", "--out", out], out.parent, out.parent)


def c_eval_json(ws):
    out = ws["root"] / "eval-full" / "eval.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text('{"old": true}\n')
    return (["eval", "--drafter", ws["root"] / "drafter", "--store", ws["root"] / "hidden", "--model", ws["target"],
             "--split", "all", "--out", out], out.parent, out.parent)


def small_run(ws) -> Path:
    """A run folder with two valid metrics lines and a journal (enough for compare and journal)."""
    import json

    run = ws["root"] / "run-small"
    run.mkdir(exist_ok=True)
    lines = [{"split": "val", "epoch": e, "step": 10 * (e + 1), "tokens_seen": 640 * (e + 1), "lr": 1e-4,
              "metrics": {"loss_0": 2.0 - e, "full_acc_0": 0.3 + 0.1 * e, "accept_len": 1.2 + 0.1 * e}}
             for e in range(2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "journal.md").write_text("# journal\n")
    (run / ".journal.lock").touch()   # left by any earlier journal entry
    return run


def c_compare_out(ws):
    run = small_run(ws)
    out = fresh(ws, "compare-full")
    out.mkdir()
    (out / "compare.md").write_text("old table\n")
    return ["compare", run, "--out", out], out, out


def c_journal_add(ws):
    run = small_run(ws)
    return ["journal", "add", run, "tried a higher lr", "--kind", "result"], run, run


CASES = {"prepare": c_prepare, "capture": c_capture, "vocab build": c_vocab_build, "train": c_train,
         "export over an earlier export": c_export_over_export, "import": c_import, "bench --out": c_bench_json,
         "eval --out": c_eval_json, "compare --out": c_compare_out, "journal add": c_journal_add}


# Commands that print lines before the error: progress (the disk fills after the work has started),
# or a data-quality warning (eval --split all says it includes the training samples).
MID_RUN = ("train", "capture", "bench --out", "eval --out")


@pytest.mark.parametrize("name", list(CASES))
def test_disk_full_is_one_line_and_keeps_old_outputs(name, ws, full_disk, monkeypatch, capsys):
    args, keep, armed = CASES[name](ws)

    def build(_ws):
        full_disk(armed)
        return args, keep

    line = check_refusal(ws, monkeypatch, capsys, build, PHRASE, after_start=name in MID_RUN)
    print(f"\n{name}\t{line}")
    leftovers = list(Path(armed).rglob("*.tmp")) if Path(armed).exists() else []
    assert not leftovers, f"temp files left behind: {leftovers}"


def test_safetensors_write_error_is_one_line(tmp_path):
    """safetensors raises SafetensorError, not OSError, when a write fails: still one line naming
    the path and the errno. A real failure: a file-size limit (EFBIG) stands in for the full disk."""
    import resource
    import signal

    from safetensors.torch import save_file

    from specdraft.io import os_error_line

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(Exception) as info:
            save_file({"x": torch.zeros(1 << 16)}, str(tmp_path / "shard.safetensors"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert not isinstance(info.value, OSError), type(info.value)
    line = os_error_line(tmp_path / "shard.safetensors", info.value)
    assert line is not None and "(EFBIG)" in line and "shard.safetensors" in line, line


def test_debug_env_shows_the_traceback(ws, monkeypatch, capsys):
    """SPECDRAFT_DEBUG=1 keeps the one-line error and adds the traceback for a bug report."""
    from bad_workspace import run_cli

    monkeypatch.setenv("SPECDRAFT_DEBUG", "1")
    code, err, _ = run_cli(monkeypatch, capsys, ["generate", "--model", ws["target"], "--prompt", "hi",
                                                 "--method", "ngram", "-k", "0"])
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith(
        "error: --num-speculative-tokens 0"), err


# ----------------------------------------------------------------------------- a re-run that stops midway (issue 25)

def dead_pid() -> int:
    """The pid of a process that has ended (what a killed writer's temp names carry)."""
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_prepare_rerun_failing_midway_keeps_the_previous_result(ws, monkeypatch, capsys):
    """A prepare re-run into a finished folder that fails while writing its rows (disk full) used to
    have deleted prepare.json first: the previous complete result was unreadable. It stays whole now,
    and the half-written rows folder is removed."""
    import datasets

    from bad_workspace import run_cli
    from specdraft.data.prepared import load_prepared

    out = fresh(ws, "data-rerun")
    args = ["prepare", "--model", ws["target"], "--conversations", ws["root"] / "good.jsonl", "--out", out]
    assert run_cli(monkeypatch, capsys, args)[0] == 0
    before = load_prepared(out)[1]

    def fail(self, path, *a, **k):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "data-00000-of-00001.arrow").write_bytes(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", fail)
    code, err, _ = run_cli(monkeypatch, capsys, args)
    assert code == 2 and PHRASE in err and len(err.strip().splitlines()) == 1, err
    assert load_prepared(out)[1] == before
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_killed_writers_leftovers_are_removed_and_said(ws, tmp_path, capsys):
    """A writer killed midway leaves .NAME.PID-XXXX.tmp (a file or a folder), or, between the two
    renames of a folder swap, the previous checkpoint set aside in .NAME.PID-XXXX.old/ with NAME
    gone. The next write removes them, puts the previous result back, and says so in one line; a live
    writer's temp files are left alone. When that next write fails too, the previous result stays."""
    from specdraft.errors import SpecdraftError
    from specdraft.formats.checkpoints import _write_folder_atomically, export
    from specdraft.io import write_json

    pid = dead_pid()
    export(ws["root"] / "drafter", tmp_path / "old-export", "speculators")
    before = sorted(p.name for p in (tmp_path / "old-export").iterdir())
    aside = tmp_path / f".export.{pid}-abc123.old"
    aside.mkdir()
    os.replace(tmp_path / "old-export", aside / "export")          # killed between the two renames
    half = tmp_path / f".export.{pid}-def456.tmp"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"half")
    (tmp_path / f".eval.json.{pid}-gh78ij90.tmp").write_text('{"half')
    live = tmp_path / f".eval.json.{os.getpid()}-kl12mn34.tmp"
    live.write_text("{}")

    def fail(folder):
        (folder / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(SpecdraftError, match=r"no space left on device"):
        _write_folder_atomically(tmp_path / "export", fail)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "removed 3 leftover(s)" in err and "put back export" in err, err
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == before   # the previous result, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["export", live.name]), list(tmp_path.iterdir())
    write_json(tmp_path / "eval.json", {"ok": True})   # our own pid: a live writer's file stays
    assert live.exists() and not capsys.readouterr().err
