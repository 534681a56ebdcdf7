"""RUN/probe*.json: what `specdraft probe` found before a fine-tune (analysis/probe.py writes it; the report shows
its verdict and the JSON). Only the fields a reader uses are typed; the probe's measurements pass as they are."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr


class Best(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    k: StrictInt | None = None
    tokens_per_s: float | None = None


class ProbeResult(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    verdict: StrictStr | None = None
    best: Best | None = None
