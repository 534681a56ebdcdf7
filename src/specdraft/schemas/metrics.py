"""RUN/metrics.jsonl: one JSON object per line (train/loop writes them through metrics.py; compare, report, watch,
doctor and -k auto read them back with metrics.load_run). A record's metrics sit at the top level or under
"metrics" (metrics.flatten joins them); the named fields have their types and every other field is a metric:
a number."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr


class MetricsRecord(BaseModel):
    """A flattened record. A field given as null is refused like any other wrong type (absent is fine)."""
    model_config = ConfigDict(strict=True, extra="allow")
    __pydantic_extra__: dict[str, float]          # every metric (loss, full_acc_0, ...): a number, never a bool
    split: StrictStr = None
    epoch: StrictInt = None
    step: StrictInt = None
    tokens_seen: float = None
    lr: float = None
