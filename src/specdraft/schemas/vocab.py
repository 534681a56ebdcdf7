"""A vocab.safetensors file's header: its "specdraft" metadata key, a JSON object (vocab.py's `vocab build` writes
it; load, diff, remap and train's store check read it). An older or foreign file holds plain string keys instead,
of which only the counts (COUNTS, digits) are read."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr

COUNTS = ("target_vocab_size", "draft_vocab_size", "distinct_tokens", "format_version")


class VocabHeader(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    target_vocab_size: StrictInt | None = None
    draft_vocab_size: StrictInt | None = None
    target_id: StrictStr | None = None
    fingerprint: StrictStr | None = None
    tokenizer: StrictStr | None = None
    coverage: float | None = None
    distinct_tokens: StrictInt | None = None
    format_version: StrictInt | None = None
