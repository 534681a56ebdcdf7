"""RUN/plan.json (and plan --out): the draft length K chosen from measured costs (analysis/plan.plan writes it
from infer/costmodel's ChainOptions). Read by the report (plan_html) and the doctor (round_cost)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

Number = float     # strict: an int is taken, a bool or a string is not


class Option(BaseModel):
    """One K the cost model ranked (costmodel.ChainOption)."""
    model_config = ConfigDict(strict=True, extra="allow")
    k: StrictInt | None = Field(None, ge=0)
    tokens_per_cycle: Number | None = None
    cycle_ms: Number | None = None
    tokens_per_s: Number | None = None
    speedup: Number | None = None
    draft_share: Number | None = None
    verify_share: Number | None = None


class Accept(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    source: StrictStr | None = None
    cond_acc: list[Number] = []


class Floor(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    weight_mb: Number | None = None
    bandwidth_gbs: Number | None = None
    floor_ms: Number | None = None


class Timing(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    floor: Floor | None = None


class PlanFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    best: Option | None = None
    options: list[Option] = []
    verify_ms: list[Number] = []          # ms of a verify of 1, 2, ... rows
    draft_ms: Number | None = Field(None, ge=0)
    accept: Accept = Accept()
    timing: Timing | None = None
    warnings: list[StrictStr] = []


def read_plan(path: Path, run: Path | str) -> PlanFile:
    """plan.json checked against PlanFile: a field of the wrong type is one line naming it."""
    from specdraft.io import read_model

    return read_model(path, PlanFile, "plan", f"re-run `specdraft plan --run {run}` (it rewrites the file)")
