"""Baseline watch: flag a run that stays behind its baseline at equal tokens_seen.

Why: in the seed, the K2-initialised fine-tune sat at ~30% while from-scratch was at ~50% at the
same point of epoch 0, and the plateau (38% vs 74.7%) was only acted on epochs later. The watch
compares the live run's validation points (or an EMA of its train curve, never one noisy batch)
with the baseline's curve interpolated at the same tokens_seen, and after a warm-up returns a
Verdict with the numbers once the run has been behind by more than a margin for a window.

Wiring in a training loop (one call per log record; `check` also writes the journal warning):

    watch = BaselineWatch.from_run(cfg.baseline) if cfg.baseline else None
    ...
    if watch and watch.check(record, run_dir) and cfg.stop_if_behind:
        stop = True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdraft import journal, run_layout
from specdraft.errors import SpecdraftError
from specdraft.metrics import Run, curve, flatten, load_run


@dataclass
class WatchConfig:
    split: str = "val"                # "val": validation points; "train": EMA of train records
    metric: str = "full_acc_0"        # higher is better
    margin: float = 0.05              # behind when run < baseline - margin (absolute)
    loss_metric: str = "loss_0"       # lower is better
    loss_margin: float | None = None  # behind when run > baseline * (1 + loss_margin); None = off
    warmup_tokens: float = 0.0        # no verdict before this many tokens
    window_tokens: float = 0.0        # behind continuously over at least this many tokens ...
    min_points: int = 2               # ... and at least this many consecutive points
    ema: float = 0.9                  # smoothing of train records (split="train")


@dataclass
class Point:
    tokens_seen: float
    run: float
    baseline: float
    run_loss: float | None = None
    baseline_loss: float | None = None
    behind: bool = False


@dataclass
class Verdict:
    metric: str
    margin: float
    evidence: list[Point]             # the consecutive behind points, oldest first
    message: str = ""
    kind: str = "behind"              # "behind", or "no number": the run logged NaN/inf (diverged?)

    def to_dict(self) -> dict:
        return {"metric": self.metric, "margin": self.margin, "message": self.message, "kind": self.kind,
                "evidence": [vars(p) for p in self.evidence]}


@dataclass
class BaselineWatch:
    baseline: Run
    config: WatchConfig = field(default_factory=WatchConfig)
    verdict: Verdict | None = None
    points: list[Point] = field(default_factory=list)
    _streak: list[Point] = field(default_factory=list)
    _ema: dict = field(default_factory=dict)   # metric -> (acc, weight)

    def __post_init__(self):
        c = self.config
        smooth = c.ema if c.split == "train" else 0.0
        self._base = curve(self.baseline, c.split, c.metric, smooth)
        self._base_loss = curve(self.baseline, c.split, c.loss_metric, smooth)
        if not len(self._base[0]):
            raise SpecdraftError(f"{self.baseline.path}: baseline has no {c.split} records with "
                                 f"{c.metric} and tokens_seen; train it longer or choose another baseline")
        problem = baseline_without_number(self.baseline, c)
        if problem:   # interpolating across it compares with NaN, which is never "behind": no verdict ever
            raise SpecdraftError(problem)

    @classmethod
    def from_run(cls, path: str | Path, config: WatchConfig | None = None) -> "BaselineWatch":
        return cls(load_run(path), config or WatchConfig())

    def _smoothed(self, rec: dict, metric: str) -> float | None:
        if rec.get(metric) is None:
            return None
        if self.config.split != "train":
            return float(rec[metric])
        acc, weight = self._ema.get(metric, (0.0, 0.0))
        a = self.config.ema
        acc, weight = a * acc + (1 - a) * float(rec[metric]), a * weight + (1 - a)
        self._ema[metric] = (acc, weight)
        return acc / weight

    @staticmethod
    def _at(curve_xy, tokens: float) -> float | None:
        """Baseline value at `tokens` by linear interpolation; None outside its range (no extrapolation)."""
        x, y = curve_xy
        if not len(x) or tokens < x[0] or tokens > x[-1]:
            return None
        return float(np.interp(tokens, x, y))

    def update(self, record: dict, where: str | None = None) -> Verdict | None:
        """Feed one metrics record; returns the Verdict once, when the run is found behind, or when
        a metric it compares is NaN or infinite (kind "no number": a comparison with NaN is never
        "behind", so without this a diverged run would pass as level). `where` names the record
        (FILE:LINE) in that message."""
        c, rec = self.config, flatten(record)
        if rec.get("split") != c.split or rec.get("tokens_seen") is None:
            return None
        value, loss = self._smoothed(rec, c.metric), self._smoothed(rec, c.loss_metric)
        tokens = float(rec["tokens_seen"])
        bad = [(m, rec[m]) for m, v in ((c.metric, value), (c.loss_metric, loss))
               if v is not None and not math.isfinite(v) and (m == c.metric or c.loss_margin is not None)]
        if bad:
            point = Point(tokens, float("nan") if value is None else value, float("nan"), loss, None, False)
            self.points.append(point)
            if self.verdict is not None:
                return None
            metric, raw = bad[0]
            self.verdict = Verdict(c.metric, c.margin, [point], kind="no number", message=(
                f"no number: {c.split} {metric} is {number_word(raw)} at {tokens:,.0f} tokens (step "
                f"{rec.get('step', '?')}, {where or 'the record fed to the watch'}); the run diverged or logged "
                "no number there, so it cannot be compared with the baseline"))
            return self.verdict
        base = self._at(self._base, tokens)
        if value is None or base is None:
            return None
        base_loss = self._at(self._base_loss, tokens)
        behind = value < base - c.margin
        if c.loss_margin is not None and loss is not None and base_loss is not None:
            behind = behind or loss > base_loss * (1 + c.loss_margin)
        point = Point(tokens, value, base, loss, base_loss, behind)
        self.points.append(point)
        if tokens < c.warmup_tokens or not behind:
            self._streak = []
            return None
        self._streak.append(point)
        span = self._streak[-1].tokens_seen - self._streak[0].tokens_seen
        if self.verdict is None and len(self._streak) >= c.min_points and span >= c.window_tokens:
            self.verdict = Verdict(c.metric, c.margin, list(self._streak), describe(self._streak, c))
            return self.verdict
        return None

    def check(self, record: dict, run_dir: str | Path | None = None) -> bool:
        """update(); when it fires, append the verdict to RUN/journal.md as a warning. True = fired."""
        where = str(run_layout.metrics_file(run_dir)) if run_dir is not None else None
        verdict = self.update(record, where)
        if verdict is None:
            return False

        journal.record(run_dir, "warning", verdict.message, source="watch")
        return True


def number_word(value) -> str:
    """NaN, inf or -inf as people write them."""
    value = float(value)
    return "NaN" if value != value else ("inf" if value > 0 else "-inf")


def baseline_without_number(baseline: Run, c: WatchConfig) -> str | None:
    """The one-line problem when a baseline metric the watch compares with is NaN or infinite
    (first such record, by FILE:LINE); None when every one is a number."""
    metrics = [c.metric] + ([c.loss_metric] if c.loss_margin is not None else [])
    for i, rec in enumerate(baseline.records):
        if rec.get("split") != c.split or rec.get("tokens_seen") is None:
            continue
        for m in metrics:
            if rec.get(m) is not None and not math.isfinite(float(rec[m])):
                return (f"{baseline.where(i)}: baseline {c.split} {m} is {number_word(rec[m])} (step "
                        f"{rec.get('step', '?')}); the baseline diverged or logged no number there, so no run can "
                        "be compared with it: choose another baseline run")
    return None


def describe(streak: list[Point], c: WatchConfig) -> str:
    last = streak[-1]
    what = f"{c.split} {c.metric}" + (" (EMA)" if c.split == "train" else "")
    text = (f"behind baseline: {what} {last.run:.3f} vs {last.baseline:.3f} at {last.tokens_seen:,.0f} tokens "
            f"(gap {last.baseline - last.run:+.3f}, margin {c.margin}) for {len(streak)} consecutive points "
            f"since {streak[0].tokens_seen:,.0f} tokens")
    if last.run_loss is not None and last.baseline_loss is not None:
        text += f"; {c.loss_metric} {last.run_loss:.3f} vs {last.baseline_loss:.3f}"
    return text


def replay(run: Run, baseline: Run, config: WatchConfig | None = None) -> tuple[Verdict | None, list[Point]]:
    """Run the watch offline over a finished run's records (used by compare and tests)."""
    watch = BaselineWatch(baseline, config or WatchConfig())
    for i, rec in enumerate(run.records):
        watch.update(rec, run.where(i))
    return watch.verdict, watch.points
