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


def raw_json(path):
    """None where `path` is absent, "invalid" where it holds no JSON, else what it holds."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "invalid"


def typed_json(path, model, fix: str):
    """A side file a report shows whatever state it is in: None where it is absent, "invalid" where it is no JSON
    object, else its content checked against `model` (a wrong type is one line naming the file and the field),
    as a dict of what it holds."""
    from specdraft.io import check_model

    data = raw_json(path)
    if not isinstance(data, dict):
        return None if data is None else "invalid"
    return check_model(data, model, path, fix).model_dump(exclude_unset=True)
