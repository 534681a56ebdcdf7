"""A training checkpoint's inputs.json: the data it trained on (train/inputs.data_identity writes it; an
export's copy also carries the run's split). Read by train --resume, eval, report and the model card."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from specdraft.schemas import TargetIdentity

INPUTS_FILE = "inputs.json"


class InputsRecord(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    store: StrictStr | None = None                # a run over several stores names them "A + B"
    layer_ids: list[StrictInt] | None = None
    hidden_size: StrictInt | None = Field(None, ge=1)
    target: TargetIdentity = TargetIdentity()
    data_fingerprint: StrictStr | None = None
    num_samples: StrictInt | None = Field(None, ge=0)
    num_tokens: StrictInt | None = Field(None, ge=0)
    store_format: StrictStr | None = None
    val_fraction: StrictFloat | StrictInt | None = Field(None, ge=0, lt=1)   # an export's: the run's split
    seed: StrictInt | None = None


def read_inputs(path: Path, fix: str) -> dict:
    """inputs.json checked against InputsRecord, as the dict it holds ({} where the file is missing)."""
    from specdraft.io import read_model

    if not Path(path).is_file():
        return {}
    return read_model(path, InputsRecord, "checkpoint inputs", fix).model_dump(exclude_unset=True)
