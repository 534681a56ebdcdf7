"""The console progress bar over optimizer steps (rank 0, --progress)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class progress_bar:
    """A rich progress bar over optimizer steps with tokens/s, or nothing."""

    def __init__(self, enabled: bool, total: int, done: int):
        self.enabled, self.total, self.done = enabled, total, done

    def __enter__(self):
        if not self.enabled:
            return lambda tokens: None
        self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[tps]} tok/s"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
        self.progress.start()
        task = self.progress.add_task("train", total=self.total, completed=self.done, tps="-")
        start, seen = time.perf_counter(), [0]

        def advance(tokens: int) -> None:
            seen[0] += tokens
            rate = seen[0] / max(time.perf_counter() - start, 1e-9)
            self.progress.update(task, advance=1, tps=f"{rate:,.0f}")
        return advance

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.stop()
        return False
