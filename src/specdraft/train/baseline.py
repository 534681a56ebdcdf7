"""The baseline watch during training (--baseline): loaded before anything is written, replayed
over the run's own metrics on --resume, fed each record the loop logs. The watch itself (what
"behind" means) is watch.py."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from specdraft import run_layout
from specdraft.watch import BaselineWatch
from specdraft.errors import SpecdraftError
from specdraft.metrics import load_run
from specdraft.train.config import RunConfig
from specdraft.train.runtime import Runtime, any_rank


def load_watch(cfg: RunConfig, run_dir: Path):
    """The baseline watch, checked before anything is written. Every rank loads it, so a bad
    --baseline fails everywhere at once; only rank 0 feeds it."""
    if Path(cfg.baseline).resolve() == run_dir.resolve():
        raise SpecdraftError(f"--baseline {cfg.baseline}: is this run itself; pass another run folder")
    return BaselineWatch.from_run(cfg.baseline, cfg.watch_config())


def replay_run(watch, run_dir: Path, log) -> None:
    """On resume, feed the run's metrics.jsonl (already cut at the checkpoint's step) through the
    watch, so smoothing and the behind-streak continue where they were; a verdict found there is
    reported on the console, not journaled again (the first run journaled it)."""
    if not run_layout.metrics_file(run_dir).exists():
        return
    run = load_run(run_dir)
    for i, rec in enumerate(run.records):
        watch.update(rec, run.where(i))
    if watch.verdict is not None:
        log(Text.assemble(("watch (before resume):", "yellow"), f" {watch.verdict.message}"))


def watch_record(watch: BaselineWatch | None, record: dict, cfg: RunConfig, runtime: Runtime, log) -> bool:
    """Feed one logged record to the watch (rank 0 only, which journals a verdict). Collective when
    a baseline is set: True on every rank once the watch fired and --stop-if-behind asks to stop."""
    if watch is None:
        return False
    fired = runtime.is_main and watch.check(record, Path(cfg.out))
    if fired:
        log(Text.assemble(("watch:", "yellow"), f" {watch.verdict.message}"))
    return any_rank(runtime, fired and cfg.stop_if_behind)
