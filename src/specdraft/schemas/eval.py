"""RUN/eval.json (and eval --out): τ simulated from stored hidden states (analysis/evaluate.py writes it).
Read by the report and the model card."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr


class EvalFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    cond_acc: list[float] | None = None
    full_acc: list[float] | None = None
    accept_len_by_k: list[float] | None = None
    accept_len: float | None = None
    split: StrictStr | None = None
    drafter: StrictStr | None = None
    samples: StrictInt | None = None
    by_context: dict | None = None
