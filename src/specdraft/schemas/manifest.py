"""STORE/manifest.json: a hidden-state store's index, what capture and store convert write (data/store.py) and every
reader checks through data/store.read_manifest, which adds the checks across fields (shard ranges and totals, the
target's own numbers, the format's fields)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator

from specdraft.errors import SpecdraftError
from specdraft.schemas.prepare import Part

MANIFEST = "manifest.json"
STORE_DTYPE_NAMES = ("bfloat16", "bf16", "float16", "fp16", "float32", "fp32")   # data/store.STORE_DTYPES' keys


def safe_shard_path(root: Path, name: object) -> Path:
    """A manifest shard entry is a plain file name inside the store; anything else is refused."""
    if (not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..")
            or Path(name).is_absolute() or Path(name).name != name):
        raise SpecdraftError(f"{root / MANIFEST}: shard path {name!r} points outside the store; "
                             "shard entries must be plain file names such as shard-00000.safetensors")
    return root / name


Count = Annotated[StrictInt, Field(ge=0)]
Positive = Annotated[StrictInt, Field(ge=1)]


class ManifestTarget(BaseModel):
    fingerprint: StrictStr = ""
    num_layers: Positive = None       # older stores lack these three; a null one is refused
    hidden_size: Positive = None
    vocab_size: Positive = None


class ShardEntry(BaseModel):
    file: object                      # a plain file name inside the store (safe_shard_path, via the context)
    samples: tuple[StrictInt, StrictInt]
    num_tokens: Count
    sha256: StrictStr

    @field_validator("file")
    @classmethod
    def inside_the_store(cls, name, info: ValidationInfo):
        try:
            return safe_shard_path(info.context["root"], name).name
        except SpecdraftError as e:          # a ValueError, so pydantic reports it in field order
            raise ValueError(str(e)) from None


class Manifest(BaseModel):
    """The manifest's typed fields (the rest, such as data and capture settings, pass as they are)."""
    target: ManifestTarget
    layer_ids: Annotated[list[Count], Field(min_length=1)]
    dtype: Literal[STORE_DTYPE_NAMES]
    hidden_size: Positive
    num_samples: Count
    num_tokens: Count
    complete: StrictBool = False
    shards: list[ShardEntry]
    part: Part | None = None          # capture --part I/N (train puts parts back in the whole set's order)
