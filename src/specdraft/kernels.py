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
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch

from specdraft.errors import SpecdraftError

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


def cpu_identity() -> dict:
    """What the fastest kernel depends on, besides the shape."""
    return {**cpu_info(), "torch": torch.__version__, "threads": torch.get_num_threads()}


@lru_cache(maxsize=1)
def cpu_info() -> dict:
    name, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.strip()
    except OSError:
        pass
    return {"cpu": name, "flags_sha": hashlib.sha256(flags.encode()).hexdigest()[:12],
            "avx512": "avx512f" in flags.split(), "avx512_bf16": "avx512_bf16" in flags.split(),
            "amx": "amx_tile" in flags.split()}


def vector_isa(info: dict | None = None) -> str:
    """This CPU's widest matrix/vector kind: amx, avx512-bf16, avx512 or avx2 (what timings depend on)."""
    info = info or cpu_info()
    return "amx" if info["amx"] else ("avx512-bf16" if info["avx512_bf16"] else "avx512") if info["avx512"] else "avx2"


def cpu_label() -> str:
    """The CPU's model name and vector kind, named beside every timing a benchmark reports."""
    return f"{cpu_info()['cpu']} ({vector_isa()})"


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
    missing = [s for s in shapes if shape_name(s) not in table.timings]
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
    saved for this machine."""
    choice = {rows: pick(t) for rows, t in ms.items()}
    write_cache(forward_file(linears), {"machine": cpu_identity(), "dtype": str(linears[0].weight.dtype),
                                        "ms": {str(r): t for r, t in ms.items()},
                                        "choice": {str(r): c for r, c in choice.items()}})
    return choice


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


FLOOR_BYTES = 256 << 20         # the copy that measures bandwidth: far beyond any last-level cache


def copy_bandwidth_gbs(nbytes: int = FLOOR_BYTES, repeats: int = 5) -> float:
    """This machine's memory bandwidth as a torch copy of `nbytes` sees it: bytes copied per second (GB/s),
    median of `repeats`, measured now (it depends on the CPU, the memory and what else runs)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)                                                              # first touch
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def streamed_weight_bytes(model) -> int:
    """Bytes of the weights one forward of a row reads: every parameter once (tied ones once), the input
    embedding only where it is the output head too (a lookup reads a row, not the table), and of an MoE
    target's routed experts only the share a token routes to (adapter.active_fraction: Kimi-K2.5 reads
    8 of 384)."""
    from specdraft.adapter import active_fraction, is_expert_weight

    embed = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = head is not None and embed is not None and head.weight.data_ptr() == embed.data_ptr()
    active = active_fraction(model.config) if hasattr(model, "config") else 1.0
    seen, total = set(), 0.0
    for name, p in model.named_parameters():
        if p.data_ptr() in seen or (p is embed and not tied):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size() * (active if is_expert_weight(name) else 1.0)
    return int(total)


def weight_floor(model, bandwidth_gbs: float | None = None) -> dict:
    """The floor of a forward bound by memory bandwidth (issue 35): streamed weight bytes / copy bandwidth.
    A forward of a few rows on a CPU reads every weight once whatever the row count, so its time cannot
    fall below this; verify times are read as multiples of it."""
    bandwidth = bandwidth_gbs or copy_bandwidth_gbs()
    nbytes = streamed_weight_bytes(model)
    return {"weight_mb": nbytes / 1e6, "bandwidth_gbs": bandwidth, "floor_ms": nbytes / bandwidth / 1e6}


def floor_line(floor: dict, verify_ms: list[float] | None = None) -> str:
    """'floor: 538 MB of weights / 19.2 GB/s (copy) = 28.0 ms; verify 1..4 = 2.1 1.9 2.2 2.3x floor'."""
    line = (f"floor: {floor['weight_mb']:.0f} MB of weights / {floor['bandwidth_gbs']:.1f} GB/s (a torch copy, "
            f"measured now) = {floor['floor_ms']:.1f} ms per forward")
    if verify_ms:
        line += f"; verify 1..{len(verify_ms)} = " + " ".join(f"{v / floor['floor_ms']:.1f}" for v in verify_ms) + "x floor"
    return line


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
