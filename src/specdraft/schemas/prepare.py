"""prepare.json: what `specdraft prepare` made and from what (data/prepare.prepared_meta writes it). The fields
its readers use (capture, train, vocab, the n-gram datastore, eval, doctor, the recipe) are typed here; the rest
is kept as written."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from specdraft.schemas import TargetIdentity

META = "prepare.json"


def _index_of_count(part: list[int]) -> list[int]:
    if not (len(part) == 2 and 1 <= part[0] <= part[1]):
        raise ValueError("must be [index, count] with 1 <= index <= count, as `--part I/N` records it")
    return part


Part = Annotated[list[StrictInt], AfterValidator(_index_of_count)]   # prepare.json's and a manifest's `part`


class Thinking(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    style: StrictStr | None = None
    mode: StrictStr | None = None


class PrepareRecord(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    source: StrictStr | None = None
    target: TargetIdentity = TargetIdentity()
    tokenizer: StrictStr | None = None
    chat_template_sha256: StrictStr | None = None
    chat_template_kwargs: dict | None = None
    thinking: Thinking | None = None
    limit: StrictInt | None = Field(None, ge=1)
    max_length: StrictInt | None = Field(None, ge=1)
    regenerate: StrictBool | None = None
    regeneration: dict | None = None
    part: Part | None = None
    counts: dict | None = None


def read_prepare_record(path: Path) -> dict:
    """prepare.json checked against PrepareRecord (one line naming the field), as the dict it holds."""
    from specdraft.io import read_model

    record = read_model(path, PrepareRecord, "prepare record", f"re-run `specdraft prepare --out {path.parent}` "
                        "(the record of the prepared data)")
    return record.model_dump(exclude_unset=True)
