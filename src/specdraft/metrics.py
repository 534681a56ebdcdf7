"""RUN/metrics.jsonl: its writer (training) and its reader (compare, watch, report, plan) in one place,
so the file's format is defined once and train/ and analysis/ both depend on this module, not on
each other.

One JSON object per line: split ("train"/"val"), epoch, step, tokens_seen, lr and the metrics
loss_k, full_acc_k, cond_acc_k, accept_len (nested under "metrics" as train writes them, or flat).
`epoch` is the 0-based index of the epoch; everything shown to people counts from 1 (the console,
the journal, compare/report tables, checkpoints/epoch-N), so `"epoch": 0` is epoch 1 and its
checkpoint is checkpoints/epoch-1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdraft import run_layout
from specdraft.errors import SpecdraftError
from specdraft.io import atomic_path, check_model, read_text
from specdraft.schemas.metrics import MetricsRecord
from specdraft.trackers import open_trackers, scalars


# ----------------------------------------------------------------------------- τ, named one way

# What a τ was measured on, in the words every printer uses (the report's table, the card, the
# console): a bench prompt set (prompts.PROMPT_SETS), a file of your prompts, or store samples.
TAU_SOURCES = {"builtin-holdout": "builtin hold-out prompts", "natural": "natural prompts",
               "long": "long-context prompts",
               "held-out": "held-out store samples", "all": "all store samples (training data included)",
               "val": "held-out store samples", "train": "training samples", "prompt": "your prompt",
               "unknown-origin": "store samples (may include the drafter's training data)",
               "unseen-store": "samples of a store it did not train on"}


def tau_source(prompts: str | None, count: int | None = None) -> str:
    """The prompt set of a τ as people read it: "26 held-out store samples", "natural prompts",
    "your prompts (FILE)"; an unknown source says so."""
    counted = isinstance(count, int) and not isinstance(count, bool)
    if not prompts:
        text = "unknown prompts (they may include training data)"
    elif str(prompts) in TAU_SOURCES:
        text = TAU_SOURCES[str(prompts)]
    else:
        return f"{count} of your prompts ({prompts})" if counted else f"your prompts ({prompts})"
    return f"{count} {text}" if counted else text


def tau_text(tau: float | None, k, prompts: str | None, count: int | None = None, digits: int = 2) -> str:
    """Every τ the tool prints, one format: "τ 1.82 at K=3 on 26 held-out store samples". τ is
    tokens per target forward; its ceiling is K+1, so a τ without its K (and its prompts) cannot be
    judged or compared."""
    value = f"{tau:.{digits}f}" if isinstance(tau, (int, float)) and not isinstance(tau, bool) else "unknown"
    return f"τ {value} at K={k if k is not None else '?'} on {tau_source(prompts, count)}"



# ----------------------------------------------------------------------------- τ by context position

CONTEXT_EDGES = (512, 2048, 4096, 8192)   # buckets <512, 512-2K, 2K-4K, 4K-8K (and >=8K when reached)


def parse_context_buckets(text: str | None) -> tuple[int, ...]:
    """--context-buckets "512,2048,4096": the bucket edges in tokens, increasing (None: CONTEXT_EDGES)."""
    if text is None:
        return CONTEXT_EDGES
    try:
        edges = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise SpecdraftError(f"--context-buckets {text}: not a comma list of token counts; "
                             "write e.g. 512,2048,4096") from None
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise SpecdraftError(f"--context-buckets {text}: give increasing positive token counts, e.g. 512,2048,4096")
    return edges


def tokens_label(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def context_buckets(edges) -> list[tuple[str, int, int | None]]:
    """(label, low, high) of each bucket: [0, e1), [e1, e2), ..., [en, no end)."""
    bounds = [0, *edges]
    rows = [(f"<{tokens_label(edges[0])}", 0, edges[0])]
    rows += [(f"{tokens_label(a)}-{tokens_label(b)}", a, b) for a, b in zip(bounds[1:], bounds[2:])]
    return rows + [(f">={tokens_label(edges[-1])}", edges[-1], None)]


def bucket_of(context: int, edges) -> int:
    """The index of the bucket (context_buckets) a context length falls in."""
    return next((i for i, e in enumerate(edges) if context < e), len(edges))


def by_context_section(taus: list[float | None], counts: list[int], edges, k, unit: str) -> dict:
    """eval.json's / bench.json's `by_context`: bucket label -> {low, high, tau, <unit>: count}."""
    return {"k": k, "edges": list(edges), "unit": unit,
            "buckets": {label: {"low": low, "high": high, "tau": tau, unit: count}
                        for (label, low, high), tau, count in zip(context_buckets(edges), taus, counts)}}


def rounds_by_context(contexts: list[int], accepted: list[int], edges, k) -> dict:
    """bench's by_context: each verify round in the bucket of its context length (the tokens before
    its root's successor: prompt plus what was generated so far), τ = (accepted + rounds) / rounds."""
    n = len(edges) + 1
    counts, taken = [0] * n, [0] * n
    for c, a in zip(contexts, accepted):
        i = bucket_of(c, edges)
        counts[i] += 1
        taken[i] += a
    taus = [(taken[i] + counts[i]) / counts[i] if counts[i] else None for i in range(n)]
    return by_context_section(taus, counts, edges, k, "rounds")


def measured_buckets(section) -> list[tuple[str, dict]]:
    """The buckets of a by_context section that hold a τ and a count, in order of context length."""
    buckets = section.get("buckets") if isinstance(section, dict) else None
    if not isinstance(buckets, dict):
        return []
    unit = section.get("unit", "rounds")
    return [(label, b) for label, b in buckets.items() if isinstance(b, dict)
            and isinstance(b.get("tau"), (int, float)) and isinstance(b.get(unit), int) and b[unit] > 0]


def bucket_text(section) -> str:
    """The measured buckets of a by_context section: "<512 2.31 (120 rounds) · 512-2K 2.05 (40 rounds)"."""
    unit = section.get("unit", "rounds") if isinstance(section, dict) else "rounds"
    return " · ".join(f"{label} {b['tau']:.2f} ({b[unit]} {unit})" for label, b in measured_buckets(section))


def by_context_text(section, prompts: str | None, count: int | None = None) -> str:
    """The one line, τ with its K and prompts: "τ by context at K=3 on 8 long-context prompts: <512 2.31
    (120 rounds) · 512-2K 2.05 (40 rounds)"."""
    rows = measured_buckets(section)
    if not rows:
        return "τ by context: nothing measured"
    k = section.get("k")
    parts = bucket_text(section)
    return f"τ by context at K={k if k is not None else '?'} on {tau_source(prompts, count)}: {parts}"

# ----------------------------------------------------------------------------- writing

class MetricsLog:
    """RUN/metrics.jsonl (one JSON object per line), the --report-to trackers (trackers.py), rich
    console table. Only the writing process (rank 0, `enabled`) opens the trackers; `with` closes them."""

    def __init__(self, run_dir: Path, enabled: bool, console, report_to: str = "none", config: dict | None = None):
        self.path = run_layout.metrics_file(run_dir)
        self.enabled, self.console = enabled, console
        self.trackers = open_trackers(report_to, run_dir, config or {}) if enabled else []

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after `step` (a resumed run logs them again)."""
        if not (self.enabled and self.path.exists()):
            return
        keep = []
        for line in read_text(self.path, "metrics file (or delete it to log anew)").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue   # a line cut short by a kill; the resumed run logs it again
            if not isinstance(record, dict) or not isinstance(record.get("step", 0), int):
                raise SpecdraftError(f"{self.path}: line {line[:60]!r} has no integer step; the metrics file is "
                                     "damaged (edited by hand?): fix or delete that line, then resume")
            if record.get("step", 0) <= step:
                keep.append(line)
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(line + "\n" for line in keep))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        for tracker in self.trackers:
            tracker.log(scalars(record), record["step"])

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc) -> None:
        """Flush and close the trackers at the run's end, or its failure."""
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []

    def epoch_table(self, epoch: int, rows: list[tuple[str, dict]], steps: int, tokens_per_s: float) -> None:
        if not self.enabled:
            return
        from rich.table import Table

        table = Table(title=f"epoch {epoch + 1}  ({tokens_per_s:,.0f} train tok/s)", title_justify="left")
        cols = ["split", "loss"] + [f"acc_{k}" for k in range(steps)] + [f"cond_{k}" for k in range(steps)] + [f"τ at K={steps}"]
        for c in cols:
            table.add_column(c, justify="right")
        for split, m in rows:
            table.add_row(split, f"{m['loss']:.4f}", *[f"{m[f'full_acc_{k}']:.3f}" for k in range(steps)],
                          *[f"{m[f'cond_acc_{k}']:.3f}" for k in range(steps)], f"{m['accept_len']:.3f}")
        self.console.print(table)


# ----------------------------------------------------------------------------- reading

@dataclass
class Run:
    name: str
    path: Path                      # the run folder (or the metrics file's folder)
    records: list[dict] = field(default_factory=list)
    file: Path | None = None        # the metrics file read, and the line number of each record in it
    lines: list[int] = field(default_factory=list)

    def where(self, index: int) -> str:
        """FILE:LINE of records[index], for messages that name a record."""
        if self.file is not None and index < len(self.lines):
            return f"{self.file}:{self.lines[index]}"
        return str(run_layout.metrics_file(self.path))

    def split(self, name: str) -> list[dict]:
        return [r for r in self.records if r.get("split") == name]

    def val_by_epoch(self) -> dict[int, dict]:
        """Last validation record of each epoch."""
        return {int(r["epoch"]): r for r in self.split("val") if "epoch" in r}


NOT_DRAFTERS = ("greedy", "plain", "ngram", "hybrid")   # bench's methods that are not a drafter's chain


def drafter_method(bench: dict) -> tuple[str, dict]:
    """(name, result) of the drafter's chain in a bench.json: the method of the family bench recorded
    (`config.family`), else (older files) the first drafter method measured; ("", {}) when bench
    measured none. The report, the card and the recipe read τ and speed from it."""
    methods = bench.get("methods") if isinstance(bench, dict) and isinstance(bench.get("methods"), dict) else {}
    config = bench.get("config") if isinstance(bench, dict) and isinstance(bench.get("config"), dict) else {}
    names = [n for n, m in methods.items() if isinstance(m, dict) and n not in NOT_DRAFTERS and "-" not in n]
    name = config.get("family") if config.get("family") in names else (names[0] if names else "")
    return name, (methods.get(name) or {}) if name else {}


def flatten(record: dict) -> dict:
    """Metrics may sit at the top level or under "metrics"; callers see one flat dict."""
    flat = {k: v for k, v in record.items() if k != "metrics"}
    flat.update(record.get("metrics") or {})
    return flat


def check_record(flat: dict, where: str) -> None:
    """Refuse a metrics line whose fields have the wrong types (hand-edited or written by another tool) through its
    one schema (schemas/metrics.py): plots and tables would otherwise fail deep inside numpy or compare strings
    with numbers."""
    check_model(flat, MetricsRecord, where, "the metrics file is damaged (edited by hand?): fix or delete that line")


def load_run(path: str | Path, name: str | None = None) -> Run:
    """A run folder holding metrics.jsonl, or the metrics.jsonl file itself."""
    path = Path(path)
    file = run_layout.metrics_file(path) if path.is_dir() else path
    if not file.exists():
        raise SpecdraftError(f"{path}: no metrics.jsonl; pass a run folder written by `specdraft train`")
    records, numbers = [], []
    lines = read_text(file, "metrics file").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                continue  # a live run may be mid-write on its last line
            raise SpecdraftError(f"{file}:{n}: not a JSON object; the metrics file is damaged") from None
        if not isinstance(rec, dict):
            raise SpecdraftError(f"{file}:{n}: expected a JSON object per line")
        check_record(flatten(rec), f"{file}:{n}")
        records.append(flatten(rec))
        numbers.append(n)
    folder = file.parent
    return Run(name or folder.name, folder, records, file, numbers)


def ema(values: np.ndarray, alpha: float) -> np.ndarray:
    """Exponential moving average (bias-corrected, so the first points are not pulled to 0)."""
    out, acc, weight = np.empty_like(values, dtype=float), 0.0, 0.0
    for i, v in enumerate(values):
        acc = alpha * acc + (1 - alpha) * v
        weight = alpha * weight + (1 - alpha)
        out[i] = acc / weight
    return out


def curve(run: Run, split: str, metric: str, smooth: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_seen, value) of `metric` over `split`, sorted by tokens, optionally EMA-smoothed."""
    pts = sorted((float(r["tokens_seen"]), float(r[metric])) for r in run.split(split)
                 if r.get(metric) is not None and r.get("tokens_seen") is not None)
    if not pts:
        return np.zeros(0), np.zeros(0)
    x, y = (np.array(v) for v in zip(*pts))
    return x, (ema(y, smooth) if smooth else y)
