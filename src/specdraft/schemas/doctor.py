"""RUN/doctor.json: `specdraft doctor`'s last diagnosis (analysis/doctor.py writes it; the report shows its causes
under the headline). The fields a reader uses are typed; each cause's evidence passes as it is."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictStr


class Cause(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    id: StrictStr | None = None
    summary: StrictStr | None = None
    estimated_tau_loss: float | None = None
    fix: StrictStr | None = None


class Checked(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    id: StrictStr | None = None


class DoctorFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    causes: list[Cause] | None = None
    checked: list[Checked] | None = None
