"""Honest timing on a shared machine: repeat, interleave, report the median and the spread.

Load that changes while methods run one after another goes straight into their ratio (one bench on
a busy machine once reported 3.17x at τ 1.37). So every measurement here runs in rounds: round r
times every item once (or `repeats` times), in an order rotated by r, and ratios are taken between
medians measured in the same rounds. Each command warns in one line when the machine was busy
(1-minute load average above the core count) at its start or end. Not torch.utils.benchmark.Timer:
it times one statement on its own (on one thread unless told), and every measurement here interleaves
its candidates in rotated rounds and keeps each round's samples (kernels.time_paths too: cold weights,
paths taking turns).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def rotated(items: Sequence[T], r: int) -> list[T]:
    """Round r's order: `items` rotated left by r (every item leads once every len(items) rounds)."""
    items = list(items)
    if not items:
        return items
    r %= len(items)
    return items[r:] + items[:r]


def spread(values: Sequence[float]) -> dict:
    """{"median", "min", "max"} of the per-round values."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def machine_load() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


BUSY_SLACK = 0.5   # load average above what the cores absorb by this much: others compete (below: noise)


def busy_warning(what: str, start: float | None, end: float | None, own_threads: int = 0) -> str | None:
    """One line when other processes competed for the cores at the start or the end of `what`: the
    load average, less `own_threads` (the command's own compute threads, which are the load a
    2-core bench puts on a quiet 2-core machine), above the cores those threads leave free, by more
    than BUSY_SLACK."""
    cores = os.cpu_count() or 1
    free = max(cores - own_threads, 0)
    busy = [f"{load:.2f} at its {when}" for when, load in (("start", start), ("end", end))
            if load is not None and load - own_threads > free + BUSY_SLACK]
    if not busy:
        return None
    own = f", {own_threads} of it this command's own threads" if own_threads else ""
    return (f"warning: {what}: the machine was busy (1-minute load average {' and '.join(busy)}{own}, on "
            f"{cores} cores); speeds are noisy, compare only ratios measured in the same rounds")


def monotonic_warning(verify_ms: Sequence[float], tolerance: float = 0.03) -> str | None:
    """One line when verifying n+1 tokens measured cheaper than n (beyond `tolerance`, noise)."""
    drops = [n + 1 for n in range(1, len(verify_ms)) if verify_ms[n] < verify_ms[n - 1] * (1 - tolerance)]
    if not drops:
        return None
    shown = " ".join(f"{v:.1f}" for v in verify_ms)
    return (f"warning: verify cost is not monotonic in n (n={', '.join(map(str, drops))} cheaper than n-1 by "
            f"> {tolerance:.0%}; medians {shown} ms): timing noise, re-run with more --rounds on a quieter machine")


def interleaved_ms(steps: dict[str, Callable[[], None]], rounds: int, repeats: int = 1,
                   on_round: Callable[[int], None] | None = None) -> dict:
    """Time each step `repeats` times per round, rounds in rotated order, after one warm-up call each.

    -> {"samples": {name: [[ms] * repeats] * rounds}, "order": [[names] * rounds],
        "stats": {name: {"median", "min", "max"} of its per-round medians}}."""
    names = list(steps)
    for name in names:
        steps[name]()                                                   # warm-up
    samples: dict[str, list[list[float]]] = {name: [] for name in names}
    order = []
    for r in range(rounds):
        order.append(rotated(names, r))
        for name in order[-1]:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                steps[name]()
                times.append(1000.0 * (time.perf_counter() - start))
            samples[name].append(times)
        if on_round:
            on_round(r)
    stats = {name: spread([statistics.median(t) for t in samples[name]]) for name in names}
    return {"samples": samples, "order": order, "stats": stats}
