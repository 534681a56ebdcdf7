"""Progress over optimizer steps (rank 0, --progress): a bar on a terminal, plain lines in a log."""

from __future__ import annotations

import contextlib

import torch

from specdraft.progress import progress


def mean_step_loss(sums: dict) -> torch.Tensor:
    """The loss the epoch table shows (the mean over TTT steps of each step's mean loss), from a
    step's sums, on their device: the optimized loss weights and adds the steps, so the bar once
    showed 49.39 where the table said 16.46."""
    steps = len([k for k in sums if k.startswith("count_")])
    return torch.stack([torch.as_tensor(sums[f"loss_sum_{k}"], dtype=torch.float64)
                        / torch.as_tensor(sums[f"count_{k}"], dtype=torch.float64).clamp(min=1)
                        for k in range(steps)]).mean()


@contextlib.contextmanager
def progress_bar(enabled: bool, total: int, done: int, console=None):
    """Yields advance(tokens, sums): one call per optimizer step. The loss is read (a GPU sync) only
    when a line is printed. `console`: the one the epoch tables print on, so that rich keeps the bar
    below them instead of on their line."""
    with progress("train", total, done, "steps", console=console, enabled=enabled) as tracker:
        yield lambda tokens, sums=None: tracker.advance(1, tokens=tokens,
                                                        **({"loss": mean_step_loss(sums)} if sums else {}))
