"""EXPORT/export.json: an export folder's own record (formats/checkpoints.export writes it with the folder): the run
and checkpoint it came from, its layout, dtype and K. The run folder is not written by export; a run's readers
(report, doctor, the recipe) find its exports by these records in the folders near it (`exports_of`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from specdraft.run_layout import LEGACY_EXPORTS

RECORD = "export.json"
# where exports_of looks for a run's exports: folders one and two levels under the run's parent and grandparent
# (the recipe's WS/export/speculators beside WS/run; the README's ws/export/vllm beside ws/runs/a)
NEAR = ("*/" + RECORD, "*/*/" + RECORD)


class ExportRecord(BaseModel):
    """EXPORT/export.json, the one schema its readers (report, doctor, recipe, served bench) share."""
    model_config = ConfigDict(strict=True)
    out: str = ""                             # the export folder (filled in on reading: the record's own folder)
    run: str | None = None                    # the training run (None: a checkpoint outside any run)
    run_from_export: str | None = None        # the same, relative to the export folder (a workspace moved whole)
    layout: str | None = None
    dtype: str | None = None
    num_speculative_tokens: int | None = Field(None, ge=1)
    checkpoint: str | None = None
    epoch: int | None = Field(None, ge=0)     # the checkpoint's, as read (a run's best/ moves on while it trains)
    step: int | None = Field(None, ge=0)


class LegacyExports(BaseModel):
    exports: list[ExportRecord] = []


def fix_line(path: Path) -> str:
    return f"fix or delete {path}, then re-export (`specdraft export RUN --out EXPORT` writes it again)"


def read_export(folder: str | Path) -> ExportRecord | None:
    """An export folder's record, typed (None where it has none); a bad field is one line."""
    from specdraft.io import read_model

    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    record = read_model(path, ExportRecord, "export record", fix_line(path))
    return record.model_copy(update={"out": str(path.parent.resolve())})


def names_run(path: Path, run: Path) -> bool:
    """Whether the export record at `path` names `run`, by its path or by its place relative to the export (read as
    it is: another folder's broken record is not ours to refuse; ours is then read through its schema)."""
    from specdraft.schemas import raw_json

    data = raw_json(path)
    if not isinstance(data, dict):
        return False
    relative = data.get("run_from_export")
    return data.get("run") == str(run) or isinstance(relative, str) and (path.parent / relative).resolve() == run


def exports_of(run: str | Path) -> list[ExportRecord]:
    """The exports of `run` found near it (NEAR), oldest first (the last is the latest); a run exported before
    export.json existed has its RUN/exports.json read instead, for the folders that hold no record."""
    from specdraft.io import read_model

    run = Path(run).resolve()
    bases = {b for b in (run.parent, run.parent.parent) if b.parent != b and b != Path.home()}   # never / or ~
    paths = {p.resolve() for base in bases for pattern in NEAR for p in base.glob(pattern) if names_run(p, run)}
    records = [read_export(p.parent) for p in sorted(paths, key=lambda p: p.stat().st_mtime)]
    legacy = run / LEGACY_EXPORTS
    if legacy.is_file():
        seen = {r.out for r in records}
        old = read_model(legacy, LegacyExports, "exports", fix_line(legacy)).exports
        records = [r for r in old if r.out not in seen] + records
    return records
