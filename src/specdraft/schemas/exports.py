"""RUN/exports.json: where a run's drafter was exported (formats/card.record_export writes it under
RUN/.exports.lock); read by report, doctor and the recipe."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from specdraft.run_layout import EXPORTS as EXPORTS_FILE   # RUN/exports.json


class ExportEntry(BaseModel):
    """One entry of RUN/exports.json (record_export): the one schema its readers (report, doctor, recipe) share."""
    model_config = ConfigDict(strict=True)
    out: str = ""
    layout: str | None = None
    dtype: str | None = None
    num_speculative_tokens: int | None = Field(None, ge=1)
    checkpoint: str | None = None
    epoch: int | None = Field(None, ge=0)     # the checkpoint's, as read (a run's best/ moves on while it trains)
    step: int | None = Field(None, ge=0)


class ExportsFile(BaseModel):
    exports: list[ExportEntry] = []


def read_exports(run: Path) -> list[ExportEntry]:
    """RUN/exports.json's entries, typed ([] where the run was never exported); a bad field is one line."""
    from specdraft.io import read_model

    path = Path(run) / EXPORTS_FILE
    if not path.is_file():
        return []
    return read_model(path, ExportsFile, "exports", f"fix or delete {path}, then re-export "
                      f"(`specdraft export {run} --out EXPORT` records it again)").exports
