"""Which dtype a target computes in on this machine: float32, or bf16 where its matmuls measure faster here.

A CPU without native bf16 (AVX2) emulates it and loses; one with AVX512-BF16 or AMX may win (issue 33). So 'auto'
times F.linear over the target's Linear shapes in each dtype once per machine, cached beside the kernel tables
(kernels.py), and keeps float32 unless another dtype beats it by DTYPE_MARGIN.
"""

from __future__ import annotations

import hashlib
import sys
import time
from typing import Callable

import torch

from specdraft.kernels import (Shape, cache_file, machine_key, measuring, positive_ms, read_cache, shape_name,
                               time_paths, within_budget, write_cache)
from specdraft.machine import cpu_identity

DTYPE_MARGIN = 0.2              # another dtype must beat float32 by this much: answers change with it
DTYPE_BUDGET_S = 15.0           # dtype timing per choice at most (a small Qwen3's capture waited 110-120 s for it)
DTYPE_ROWS_MAX = 256            # rows timed: past a few hundred rows a matmul is compute-bound, its dtype ratio set


def faster_dtype(shapes: dict[Shape, int], rows: int, candidates: tuple[str, ...] = ("float32", "bfloat16"),
                 timer: Callable[[Shape, int, torch.dtype], float] | None = None,
                 budget_s: float = DTYPE_BUDGET_S) -> tuple[str, dict[str, float]]:
    """(the dtype to compute in, each candidate's ms): F.linear over `shapes` (shape -> how many such
    Linears one forward runs) at `rows` rows (at most DTYPE_ROWS_MAX), the weights cold, timed per dtype on
    this machine once and cached beside the kernel tables; the shapes with the most work first, each in
    every dtype, until `budget_s` is spent (the ratio over the shapes timed decides). float32 unless another
    dtype beats it by DTYPE_MARGIN: a CPU without native bf16 (AVX2) emulates it and loses, one with
    AVX512-BF16 or AMX may win (issue 33)."""
    rows = min(rows, DTYPE_ROWS_MAX)
    names = sorted(shape_name(s) + f"*{n}" for s, n in shapes.items())
    key = hashlib.sha256(f"{machine_key(torch.float32)}|{names}|{rows}|{candidates}".encode()).hexdigest()[:16]
    path = cache_file(f"dtype-{key}")
    saved = read_cache(path, "dtype timing") if timer is None else None
    ms = saved.get("ms") if isinstance(saved, dict) else None
    if not (isinstance(ms, dict) and all(positive_ms(ms.get(c)) for c in candidates)):   # damaged: measured again
        if timer is None:
            print(f"compute dtype: timing {' vs '.join(candidates)} matmuls at {rows} rows on this machine (at most "
                  f"{budget_s:.0f} s, once, cached in {path})", file=sys.stderr, flush=True)
        measure = timer or (lambda shape, n, dtype: time_paths(shape, n, dtype, paths=("linear",))["linear"])
        ms, timed, started = dict.fromkeys(candidates, 0.0), 0, time.perf_counter()
        for shape, count in within_budget(sorted(shapes.items(), key=lambda sc: -sc[1] * sc[0][0] * sc[0][1]), budget_s):
            for c in candidates:
                ms[c] += count * measure(shape, rows, getattr(torch, c))
            timed += 1
        write_cache(path, {"machine": cpu_identity(), "shapes": names, "rows": rows, "ms": ms,
                           "shapes_timed": timed, "seconds": round(time.perf_counter() - started, 1)})
    best = min(candidates, key=lambda c: ms[c])
    return (best if ms[best] < ms["float32"] * (1 - DTYPE_MARGIN) else "float32"), ms


def auto_dtype(requested: str, config, rows: int, gpu: bool | None = None) -> str:
    """The dtype a target runs data in (prepare's answers, capture's hidden states): as asked, or for
    'auto' bf16 on a GPU and, on a CPU, the faster dtype at `rows` rows per matmul (faster_dtype, timed
    once per machine: a CPU with AMX or AVX512-BF16 may pick bf16, AVX2 keeps float32). Under
    SPECDRAFT_KERNEL_PATH=linear (the suite) 'auto' is float32: the same data on every machine. `gpu`:
    whether the target runs on one (default: whether one is present)."""
    from specdraft.targets import linear_counts

    if requested != "auto":
        return requested
    if torch.cuda.is_available() if gpu is None else gpu:
        return "bfloat16"
    if not measuring():
        return "float32"
    return faster_dtype(linear_counts(config), rows)[0]
