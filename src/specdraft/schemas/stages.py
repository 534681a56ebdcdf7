"""WS/stages.json beside a recipe's recipe.log: each stage's latest command, exit status and seconds (pipeline.py
writes it as each stage ends; the report shows where the recipe's time went)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, RootModel, StrictInt, StrictStr

STAGES_FILE = "stages.json"


class Stage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    command: StrictStr | None = None
    exit: StrictInt | None = None
    seconds: float | None = None
    finished: StrictStr | None = None


class StagesFile(RootModel[dict[str, Stage]]):
    """{stage name (the command's first word, or bench-natural): its latest run}."""
