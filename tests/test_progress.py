"""Progress in a log file (issue 16): long commands print plain lines when output is not a terminal
(step/total, tok/s, ETA; every SPECDRAFT_LOG_EVERY_S seconds) and keep rich bars on a terminal."""

import io
import os
import re
import subprocess
import sys

from rich.console import Console

from bad_workspace import ws  # noqa: F401  (fixture)
from specdraft.progress import progress, track

LINE = r"(\d[\d,]*(?:\.\d)?)/(\d[\d,]*) {unit} \(\d+%\).*, elapsed \d+:\d\d:\d\d, eta (\d+:\d\d:\d\d|-:--:--)$"
BAR_CHARS = "━╸╺█▏"
TABLE_EDGES = "┏┡└┃│┗┣"    # rich tables (the epoch table) are fine in a log; bars are not


def plain(text: str) -> None:
    assert "\x1b" not in text, "ANSI escape codes in a log"
    bars = [line for line in text.splitlines() if any(c in line for c in BAR_CHARS) and line[:1] not in TABLE_EDGES]
    assert not bars, f"rich bar characters in a log: {bars[:3]}"


def test_plain_lines_when_not_a_terminal(monkeypatch):
    monkeypatch.setenv("SPECDRAFT_LOG_EVERY_S", "0")
    out = io.StringIO()
    with progress("train", 4, 0, "steps", console=Console(file=out)) as tracker:
        for i in range(4):
            tracker.advance(1, tokens=100, loss=2.5 - i / 10)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("train: 0/4 steps (0%)") and lines[0].endswith("eta -:--:--")
    assert lines[-1].startswith("train: 4/4 steps (100%), loss 2.2, ") and " tok/s, " in lines[-1]
    assert len(lines) == 5 and all(re.match("train: " + LINE.format(unit="steps"), x) for x in lines)
    plain(out.getvalue())


def test_lines_only_every_interval_and_fractional_eta(monkeypatch):
    monkeypatch.setenv("SPECDRAFT_LOG_EVERY_S", "3600")
    out = io.StringIO()
    with progress("regenerating", 10, 0, "samples", console=Console(file=out)) as tracker:
        tracker.set(partial=2.5, tokens=50)      # inside the first batch: the ETA is known already
        assert tracker.eta() is not None
        for _ in range(10):
            tracker.advance(1)
    assert len(out.getvalue().splitlines()) == 2      # the start and the end, nothing between


def test_bar_on_a_terminal_and_silent_when_disabled(monkeypatch):
    monkeypatch.setenv("SPECDRAFT_LOG_EVERY_S", "0")
    out = io.StringIO()
    with progress("x", 3, 0, "items", console=Console(file=out, force_terminal=True)) as tracker:
        assert tracker.bar is not None
        tracker.advance(3)
    assert "x: 3/3" not in out.getvalue()
    quiet = io.StringIO()
    with progress("x", 3, console=Console(file=quiet), enabled=False) as tracker:
        tracker.advance(3)
    assert list(track(range(3), "y", 3, console=Console(file=quiet, quiet=True))) == [0, 1, 2]
    assert quiet.getvalue() == ""


def run_logged(tmp_path, name, args) -> str:
    """Run `specdraft ARGS` with stdout and stderr to a file (not a terminal), lines every 0 s."""
    env = {**os.environ, "SPECDRAFT_LOG_EVERY_S": "0", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    log = tmp_path / f"{name}.log"
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "specdraft.cli", *map(str, args)], stdout=f,
                              stderr=subprocess.STDOUT, env=env, timeout=300)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    plain(text)
    return text


def progress_lines(text: str, label: str, unit: str) -> list[re.Match]:
    return [m for m in re.finditer(f"^{re.escape(label)}: " + LINE.format(unit=unit), text, re.M)]


def test_train_capture_eval_log_progress_lines(ws, tmp_path):  # noqa: F811
    root = ws["root"]
    text = run_logged(tmp_path, "capture", ["capture", "--model", ws["target"], "--prepared", root / "data",
                                            "--out", tmp_path / "hidden", "--layers", "2,4,5",
                                            "--store-dtype", "float32", "--batch-tokens", "64"])
    lines = progress_lines(text, "capture", "tokens")
    assert len(lines) >= 3 and lines[-1].group(1) == lines[-1].group(2), text
    assert " tok/s, " in lines[-1].group(0)

    text = run_logged(tmp_path, "train", ["train", "--model", ws["target"], "--store", root / "hidden",
                                          "--vocab", root / "vocab.safetensors", "--out", tmp_path / "run",
                                          "--epochs", "1", "--max-tokens", "64", "--val-fraction", "0.2"])
    lines = progress_lines(text, "train", "steps")
    assert len(lines) >= 3 and lines[-1].group(1) == lines[-1].group(2), text
    assert ", loss " in lines[-1].group(0) and " tok/s, " in lines[-1].group(0)

    text = run_logged(tmp_path, "eval", ["eval", "--drafter", tmp_path / "run" / "best", "--store", root / "hidden",
                                         "--model", ws["target"], "--split", "all"])
    lines = progress_lines(text, "eval", "batches")     # one batch of 2048 tokens: the start and the end
    assert len(lines) >= 2 and lines[-1].group(1) == lines[-1].group(2), text


def test_train_bar_keeps_the_epoch_table_on_its_own_line_and_shows_the_tables_loss():
    """The bar once shared a line with "epoch 1 (78 train tok/s)" (it drew on another console than the
    table's) and showed 49.39, the weighted sum of the TTT losses, where the table said 16.46 (their mean)."""
    import io

    import torch

    from specdraft.train.progress import mean_step_loss, progress_bar

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    sums = {"loss_sum_0": torch.tensor(30.0), "count_0": torch.tensor(2.0),
            "loss_sum_1": torch.tensor(10.0), "count_1": torch.tensor(1.0)}
    assert float(mean_step_loss(sums)) == 12.5          # (15 + 10) / 2, finalize_metrics' "loss"
    with progress_bar(True, 4, 0, console) as bar:
        bar(10, sums)
        console.print("epoch 1  (78 train tok/s)")
        bar(10, sums)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue()).replace("\r", "\n")
    assert [line for line in text.split("\n") if "epoch 1" in line] == ["epoch 1  (78 train tok/s)"], text
