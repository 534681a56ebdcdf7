"""Which kernel runs a few-row nn.Linear on this CPU: chosen by timing both here, then cached.

A verify forward runs every target Linear on K+1 rows, a drafter catch-up on a few. The fastest
kernel for a [rows, in] x [in, out] product there depends on the CPU kind, its BLAS build and the
shape: on an AVX2 EPYC, F.linear on 2-8 rows took MKL's small-GEMM path at about twice a 1-row
forward while mm(W, x^T) stayed on the bandwidth-bound path; on an AVX-512 Xeon mm(W, x^T) cost
3-4x F.linear (issue 23). So nothing is hard-coded: on first use per machine (CPU model and flags,
torch version, threads, dtype) and per Linear shape, both paths are timed at each row count of
ROWS, the faster kept, and the table is cached in $SPECDRAFT_CACHE/kernels/. A row count between
two measured ones uses the next larger one; beyond the last, F.linear. SPECDRAFT_KERNEL_PATH=linear
skips the timing (F.linear everywhere: the same kernels on every machine, no first-use wait; the
test suite runs so, since a fresh cache would time every tiny model's shapes).
"""

from __future__ import annotations

import hashlib
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specdraft.errors import SpecdraftError
from specdraft.machine import cpu_identity

PATHS = ("linear", "mm")        # F.linear(x, W) | mm(W, x^T)^T (one row runs as two)
ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32)   # row counts timed (a verify is K+1, a tree up to ~25)
MARGIN = 0.05                   # mm must beat F.linear by this much: noise never flips the default
REPEATS = 5                     # timed samples per path, shape and row count (the median is kept)
METHOD = 3                      # how time_paths measures: a new method is a new cache key
COLD_BYTES = 64 << 20           # weight copies cycled per sample: more than a last-level cache holds

Shape = tuple[int, int]         # (in_features, out_features)
Timer = Callable[[Shape, int], dict[str, float]]   # (shape, rows) -> {path: ms}


def linear_rows(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor, use_mm: bool) -> torch.Tensor:
    """y = x W^T + b by either path; x [..., in] -> [..., out], contiguous (SDPA keeps its flash kernel).

    The mm path runs one row as two (the row twice, the copy dropped): a [in, 1] right-hand side
    takes BLAS's matrix-vector kernel, the same one F.linear takes, and on some CPUs that kernel
    streams the weight at a third of the speed the two-column product does (issue 23)."""
    if not use_mm:
        return torch.nn.functional.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1]
    x_rows = x.reshape(rows, -1)                                               # [rows, in]
    if rows == 1:
        x_rows = x_rows.repeat(2, 1)                                           # [2, in], the row twice
    out = torch.mm(weight, x_rows.t())[:, :rows].t().contiguous()              # [rows, out]
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], out.shape[-1])


def machine_key(dtype: torch.dtype) -> str:
    ident = cpu_identity()
    text = "|".join(str(ident[k]) for k in ("cpu", "flags_sha", "torch", "threads")) + f"|{dtype}|{METHOD}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def time_paths(shape: Shape, rows: int, dtype: torch.dtype = torch.float32, repeats: int = REPEATS,
               paths: tuple[str, ...] = PATHS) -> dict[str, float]:
    """ms per call of each path at this shape and row count, as a forward meets it: the weight cold.

    A model's weights (SmolLM2: 540 MB) stream through the cache once per forward, so timing one small
    weight again and again (hot in L2) would measure another kernel regime. Each sample runs the
    path once over enough copies of the weight to overflow the last-level cache, the paths take turns,
    and the median sample counts."""
    n_in, n_out = shape
    g = torch.Generator().manual_seed(0)
    weight_bytes = n_in * n_out * torch.tensor([], dtype=dtype).element_size()
    copies = max(1, min(COLD_BYTES // weight_bytes, 256))
    weights = [torch.randn(n_out, n_in, generator=g).to(dtype) for _ in range(copies)]   # [out, in] each
    x = torch.randn(1, rows, n_in, generator=g).to(dtype)                                 # [1, rows, in]
    samples: dict[str, list[float]] = {p: [] for p in paths}
    with torch.inference_mode():
        for r in range(repeats + 1):                  # the first round warms up
            for path in (paths if r % 2 == 0 else paths[::-1]):
                use_mm = path == "mm"
                start = time.perf_counter()
                for w in weights:
                    linear_rows(w, None, x, use_mm)
                if r:
                    samples[path].append((time.perf_counter() - start) * 1e3 / copies)
    return {p: statistics.median(v) for p, v in samples.items()}


def pick(timings: dict[str, float], margin: float = MARGIN) -> str:
    """{"linear": ms, "mm": ms, ...} -> the path to run: the fastest only where it beats F.linear by `margin`."""
    best = min(timings, key=timings.get)
    return best if timings[best] < timings["linear"] * (1 - margin) else "linear"


@dataclass
class KernelTable:
    """Per Linear shape and measured row count: the timings and the chosen path."""

    key: str
    machine: dict
    dtype: str
    timings: dict[str, dict[str, dict[str, float]]]   # "in x out" -> rows -> {path: ms}
    _flags: dict[tuple[Shape, int], tuple[bool, ...]] = field(default_factory=dict, repr=False)

    def choice(self, shape: Shape) -> dict[int, str]:
        return {int(rows): pick(t) for rows, t in self.timings.get(shape_name(shape), {}).items()}

    def use_mm(self, shape: Shape, max_rows: int = ROWS[-1]) -> tuple[bool, ...]:
        """Indexed by row count 0..max_rows: True where mm(W, x^T) runs (a row count between two
        measured ones takes the next larger one's choice)."""
        if (shape, max_rows) not in self._flags:
            chosen = self.choice(shape)
            flags = []
            for rows in range(max_rows + 1):
                measured = [r for r in sorted(chosen) if r >= rows]
                flags.append(bool(measured) and rows > 0 and chosen[measured[0]] == "mm")
            self._flags[shape, max_rows] = tuple(flags)
        return self._flags[shape, max_rows]

    def summary(self) -> list[dict]:
        """One row per shape: the row counts where mm(W, x^T) runs (the rest run F.linear)."""
        return [{"shape": name, "mm_rows": [int(r) for r, t in rows.items() if pick(t) == "mm"],
                 "linear_rows": [int(r) for r, t in rows.items() if pick(t) == "linear"]}
                for name, rows in self.timings.items()]

    def to_dict(self) -> dict:
        return {"key": self.key, "machine": self.machine, "dtype": self.dtype, "timings_ms": self.timings}


def shape_name(shape: Shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def linear_shapes(linears: list[torch.nn.Linear]) -> list[Shape]:
    return sorted({(m.in_features, m.out_features) for m in linears})


_TABLES: dict[str, KernelTable] = {}     # this process's tables, by machine key


def positive_ms(x) -> bool:
    """A timing a cache may hold: a finite number of ms above 0 (not a bool, not a string)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def usable_timings(raw) -> dict:
    """The cache file's shapes whose every entry `pick` can read (row count -> finite linear and mm
    times); anything else (hand-edited, another version's layout) is measured again, never an error."""
    def usable(rows):
        return isinstance(rows, dict) and bool(rows) and all(
            str(n).isdigit() and isinstance(t, dict) and positive_ms(t.get("linear")) and positive_ms(t.get("mm"))
            for n, t in rows.items())

    return {shape: rows for shape, rows in raw.items() if usable(rows)} if isinstance(raw, dict) else {}


def cache_file(key: str) -> Path:
    from specdraft.targets import cache_dir

    return cache_dir() / "kernels" / f"{key}.json"


def within_budget(items, budget_s: float):
    """`items` in order while `budget_s` seconds have not passed since the first (which comes unless the
    budget is already spent): the timing loops of kernel_table and faster_dtype, bounded so a new target's
    first forward waits seconds."""
    started = time.perf_counter()
    for i, item in enumerate(items):
        if budget_s <= 0 or (i and time.perf_counter() - started > budget_s):
            return
        yield item


KERNEL_BUDGET_S = 12.0          # kernel timing per process at most: a new target's first token within 30 s (issue 56)
KERNEL_SPENT = {"s": 0.0}       # kernel timing spent in this process: the drafter's and the target's tables share the budget
DEFERRED: set[tuple] = set()    # (table, shape) left to the next process (said once: a bench asks for its tables per run)


def kernel_table(shapes: list[Shape], dtype: torch.dtype = torch.float32, timer: Timer | None = None,
                 rows: tuple[int, ...] = ROWS, budget_s: float = KERNEL_BUDGET_S) -> KernelTable:
    """The table for this machine and dtype covering `shapes`: from this process, else from the cache
    file, measuring (and saving) only the shapes neither holds, the largest first, for at most `budget_s`
    seconds in this process (KERNEL_SPENT: every table asked shares it): shapes left over run F.linear in this
    process and are timed by the next one (a line says so)."""
    if timer is None and not measuring():
        return KernelTable("linear", cpu_identity(), str(dtype), {})      # F.linear at every row count
    key = machine_key(dtype)
    table = _TABLES.get(key)
    if table is None:
        saved = read_cache(cache_file(key), "kernel table")
        timings = usable_timings(saved.get("timings_ms") if isinstance(saved, dict) else None)
        table = KernelTable(key, cpu_identity(), str(dtype), timings)
        _TABLES[key] = table
    missing = [s for s in shapes if shape_name(s) not in table.timings and (key, shape_name(s)) not in DEFERRED]
    if missing:
        if timer is None:
            print(f"kernel paths: timing F.linear vs mm(W, x^T) for {len(missing)} Linear shape(s) on this machine "
                  f"({dtype}; once, cached in {cache_file(key)})", file=sys.stderr, flush=True)
        measure = timer or (lambda shape, n: time_paths(shape, n, dtype))
        started, timed = time.perf_counter(), 0
        for shape in within_budget(sorted(missing, key=lambda s: -s[0] * s[1]), budget_s - KERNEL_SPENT["s"]):
            table.timings[shape_name(shape)] = {str(n): measure(shape, n) for n in rows}
            timed += 1
            if timer is None:
                print(f"kernel paths: {timed}/{len(missing)} shape(s) timed, {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)
        KERNEL_SPENT["s"] += time.perf_counter() - started
        if timed < len(missing):
            DEFERRED.update((key, shape_name(s)) for s in missing if shape_name(s) not in table.timings)
            print(f"kernel paths: {timed} of {len(missing)} shape(s) timed in {time.perf_counter() - started:.0f} s; "
                  f"the other {len(missing) - timed} run F.linear in this process and are timed by the next",
                  file=sys.stderr, flush=True)
        write_cache(cache_file(key), table.to_dict())
    return table


def read_cache(path: Path, what: str):
    """A cache file's JSON, or None when it is missing or damaged (then measured again, never an error)."""
    from specdraft.io import read_json

    if not path.is_file():
        return None
    try:
        return read_json(path, what)
    except Exception:
        return None


def write_cache(path: Path, data: dict) -> None:
    """Save a measurement; a read-only or full cache still runs, it measures again next time."""
    from specdraft.io import write_json

    try:
        write_json(path, data)
    except (OSError, SpecdraftError):
        pass


def measuring() -> bool:
    """False under SPECDRAFT_KERNEL_PATH=linear; any other value is refused in one line."""
    path = os.environ.get("SPECDRAFT_KERNEL_PATH", "")
    if path not in ("", "linear"):
        raise SpecdraftError(f"SPECDRAFT_KERNEL_PATH={path}: use linear (F.linear at every row count, no timing) "
                             "or unset it (each Linear shape's faster kernel, timed once per machine)")
    return path != "linear"


def mm_flags(linears: list[torch.nn.Linear], timer: Timer | None = None) -> list[tuple[bool, ...]] | None:
    """Per layer, indexed by row count: True where mm(W, x^T) runs. Measures on first use; None off
    the CPU (few_row_matmul leaves such layers alone)."""
    if not linears or linears[0].weight.device.type != "cpu":
        return None
    table = kernel_table(linear_shapes(linears), linears[0].weight.dtype, timer)
    return [table.use_mm((m.in_features, m.out_features)) for m in linears]


def forward_file(linears: list[torch.nn.Linear]) -> Path:
    """Where the whole-forward choice of a model's Linear shapes lives on this machine (per dtype)."""
    shapes = sorted(shape_name((m.in_features, m.out_features)) for m in linears)
    key = hashlib.sha256(f"{machine_key(linears[0].weight.dtype)}|{shapes}".encode()).hexdigest()[:16]
    return cache_file(f"forward-{key}")


FORWARD_PATHS = ("linear", "mm", "table")   # a whole forward: F.linear everywhere, mm(W, x^T) everywhere, the table's


def whole_forward_flags(linears: list[torch.nn.Linear], flags: list[tuple[bool, ...]] | None,
                        ) -> list[tuple[bool, ...]] | None:
    """`flags` (the per-Linear table's choice) replaced at each row count where the whole forward measured
    another path faster (record_whole_forward): F.linear or mm(W, x^T) in every layer; unchanged where
    nothing was measured."""
    if not flags or not measuring():
        return flags
    saved = read_cache(forward_file(linears), "whole-forward timing")
    choice = saved.get("choice") if isinstance(saved, dict) else None
    chosen = {int(r): c for r, c in choice.items() if str(r).isdigit() and c in FORWARD_PATHS} \
        if isinstance(choice, dict) else {}
    return [tuple(f if chosen.get(rows, "table") == "table" else chosen[rows] == "mm" for rows, f in enumerate(row))
            for row in flags]


def record_whole_forward(linears: list[torch.nn.Linear], ms: dict[int, dict[str, float]]) -> dict[int, str]:
    """Per row count, the whole forward's ms on each of FORWARD_PATHS -> the path kept (`pick`, as per Linear),
    saved for this machine beside the row counts measured before (plain decoding's 1..4 rows never drop a -k auto
    record of 1..9)."""
    choice = {rows: pick(t) for rows, t in ms.items()}
    path = forward_file(linears)
    saved = read_cache(path, "whole-forward timing")
    kept = saved if isinstance(saved, dict) and all(isinstance(saved.get(k), dict) for k in ("ms", "choice")) \
        else {"ms": {}, "choice": {}}
    write_cache(path, {"machine": cpu_identity(), "dtype": str(linears[0].weight.dtype),
                       "ms": {**kept["ms"], **{str(r): t for r, t in ms.items()}},
                       "choice": {**kept["choice"], **{str(r): c for r, c in choice.items()}}})
    return choice


def target_linears(model) -> list[torch.nn.Linear]:
    """A model's plain nn.Linear layers: the shapes timed here (a module wrapper's forward or an accelerate hook,
    which replaces `forward`, keeps its own)."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in vars(m)]


def describe(model) -> dict | None:
    """The chosen paths for a CPU model's Linear shapes (what `plan` prints); None off the CPU."""
    linears = target_linears(model)
    if not linears or linears[0].weight.device.type != "cpu":
        return None
    shapes = linear_shapes(linears)
    table = kernel_table(shapes, linears[0].weight.dtype)
    names = {shape_name(s) for s in shapes}
    return {"machine": table.machine, "dtype": table.dtype,
            "cache": str(cache_file(table.key)) if measuring() else "nowhere: SPECDRAFT_KERNEL_PATH=linear",
            "shapes": [row for row in table.summary() if row["shape"] in names]}


def row_ranges(rows: list[int], measured: tuple[int, ...] = ROWS) -> str:
    """Runs of consecutive measured row counts: [2, 3, 4, 9, 12] -> '2-4, 9-12' (10, 11 are not measured)."""
    measured = sorted(set(measured) | set(rows))
    parts, start = [], None
    for i, r in enumerate(rows):
        if start is None:
            start = r
        if i + 1 == len(rows) or rows[i + 1] != measured[measured.index(r) + 1]:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)


def format_paths(described: dict) -> str:
    """One line per shape: where mm(W, x^T) runs (F.linear elsewhere)."""
    m = described["machine"]
    isa = "AMX" if m.get("amx") else "AVX-512" + ("+BF16" if m.get("avx512_bf16") else "") if m.get("avx512") else "AVX2"
    lines = [f"kernel paths on {m['cpu']} ({isa}, torch {m['torch']}, {m['threads']} threads, {described['dtype']}; "
             f"measured, cached in {described['cache']}):"]
    lines += [f"  {row['shape']:>12s}  {where_mm(row['mm_rows'])}" for row in described["shapes"]]
    return "\n".join(lines)


def where_mm(mm_rows: list[int]) -> str:
    return f"mm(W, x^T) at {row_ranges(mm_rows)} rows, F.linear elsewhere" if mm_rows else "F.linear at every row count"
