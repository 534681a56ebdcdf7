"""Progress over optimizer steps (rank 0, --progress): a bar on a terminal, plain lines in a log."""

from __future__ import annotations

import contextlib

from specdraft.progress import progress


@contextlib.contextmanager
def progress_bar(enabled: bool, total: int, done: int):
    """Yields advance(tokens, loss): one call per optimizer step. The loss is read (a GPU sync)
    only when a line is printed."""
    with progress("train", total, done, "steps", enabled=enabled) as tracker:
        yield lambda tokens, loss=None: tracker.advance(1, tokens=tokens, **({"loss": loss} if loss is not None else {}))
