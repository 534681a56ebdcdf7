"""Progress for long commands: a rich bar on a terminal, plain lines in a log file.

A rich bar redrawn in place is invisible (or garbage) when stdout/stderr go to a file, so when the
console is not a terminal the same calls print one plain line every LOG_EVERY_S seconds (and one at
the start and the end):

    train: 12/40 steps (30%), loss 2.314, 1,234 tok/s, elapsed 0:01:02, eta 0:02:25

The interval can be set with the SPECDRAFT_LOG_EVERY_S environment variable (tests set it to 0).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

from rich.console import Console

LOG_EVERY_S = 30.0


def log_every_s() -> float:
    """Seconds between plain lines: SPECDRAFT_LOG_EVERY_S, else LOG_EVERY_S."""
    try:
        return float(os.environ.get("SPECDRAFT_LOG_EVERY_S", LOG_EVERY_S))
    except ValueError:
        return LOG_EVERY_S


def clock(seconds: float | None) -> str:
    """0:01:02, or -:--:-- when unknown."""
    if seconds is None:
        return "-:--:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def show(value) -> str:
    """A field value for people: floats (and 0-dim tensors, read only when a line is due) to 4 digits."""
    if isinstance(value, str):
        return value
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)


class Tracker:
    """What the calling code talks to: advance() after each item, set() for a fractional position
    (work inside an unfinished item) or new fields. The same calls drive a bar or plain lines."""

    def __init__(self, label: str, total: float, done: float, unit: str, console: Console, bar: bool,
                 quiet: bool = False):
        self.quiet, self.label, self.total, self.unit, self.console = quiet, label, total, unit, console
        self.done, self.partial, self.tokens, self.fields, self.printed = done, 0.0, 0, {}, None
        self.start_done, self.started = done, time.perf_counter()
        self.every, self.last_line = log_every_s(), self.started
        self.bar = None
        if bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self.bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                console=console, transient=True)
            self.task = self.bar.add_task(label, total=total, completed=done, info="")

    def advance(self, n: float = 1, tokens: int = 0, **fields) -> None:
        """`n` items finished (and `tokens` tokens processed); fields such as loss=... are shown."""
        self.done += n
        self.partial = 0.0
        self.set(tokens=tokens, **fields)

    def set(self, partial: float | None = None, tokens: int = 0, **fields) -> None:
        """`partial`: the fraction of items done beyond advance()'s count (for the ETA)."""
        if partial is not None:
            self.partial = partial
        self.tokens += tokens
        self.fields.update(fields)
        if self.quiet:
            return
        if self.bar is not None:   # fields (a GPU loss) are read at most once a second
            fresh = time.perf_counter() - self.last_line >= 1.0
            if fresh:
                self.last_line = time.perf_counter()
            self.bar.update(self.task, completed=self.done + self.partial,
                            **({"info": self.info()} if fresh else {}))
        elif time.perf_counter() - self.last_line >= self.every:
            self.line()

    def info(self) -> str:
        parts = [f"{k} {show(v)}" for k, v in self.fields.items()]
        if self.tokens:
            parts.append(f"{self.tokens / max(time.perf_counter() - self.started, 1e-9):,.0f} tok/s")
        return ", ".join(parts)

    def eta(self) -> float | None:
        now, left = self.done + self.partial, self.total - self.done - self.partial
        rate = (now - self.start_done) / max(time.perf_counter() - self.started, 1e-9)
        return max(left, 0.0) / rate if rate > 0 else None

    def line(self) -> None:
        """One plain progress line, flushed at once (a log file shows it while the run goes on)."""
        if self.quiet:
            return
        self.last_line, self.printed = time.perf_counter(), self.done + self.partial
        pct = 100 * (self.done + self.partial) / self.total if self.total else 100.0
        info = self.info()
        count = f"{self.done + self.partial:,.1f}" if self.partial else f"{self.done:,.0f}"   # agrees with pct
        text = (f"{self.label}: {count}/{self.total:,.0f} {self.unit} ({pct:.0f}%)"
                + (f", {info}" if info else "")
                + f", elapsed {clock(self.last_line - self.started)}, eta {clock(self.eta())}")
        self.console.file.write(text + "\n")
        self.console.file.flush()


@contextlib.contextmanager
def progress(label: str, total: float, done: float = 0, unit: str = "", console: Console | None = None,
             enabled: bool = True) -> Iterator[Tracker]:
    """A Tracker over `total` items (`done` already done), shown as a bar when `console` (stderr by
    default) is a terminal and as plain lines otherwise; silent when not `enabled` (same calls)."""
    console = console or Console(stderr=True)
    tracker = Tracker(label, total, done, unit, console, bar=enabled and console.is_terminal,
                      quiet=not enabled or console.quiet)
    if tracker.bar is not None:
        with tracker.bar:
            yield tracker
        return
    tracker.line()
    yield tracker
    if tracker.printed != tracker.done + tracker.partial:   # the last line shows the end
        tracker.line()


def track(items, label: str, total: int, unit: str = "", tokens=None, console: Console | None = None):
    """Yield `items` while showing progress over them; `tokens(item)` counts tokens for tok/s."""
    with progress(label, total, 0, unit, console=console) as tracker:
        for item in items:
            yield item
            tracker.advance(1, tokens=tokens(item) if tokens else 0)
