"""One pydantic model per file the tool reads back, one module per file kind: the schema a file's writer
fills and every reader checks (io.read_model: one line naming the file, the field and the fix)."""

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr


class TargetIdentity(BaseModel):
    """A target as a file records it (targets.identity: its id and fingerprint, and more keys kept); what
    prepare.json's and inputs.json's `target` hold."""
    model_config = ConfigDict(strict=True, extra="allow")
    id: StrictStr | None = None
    fingerprint: StrictStr | None = None
    vocab_size: StrictInt | None = Field(None, ge=1)

