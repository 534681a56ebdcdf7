"""RUN/bench_vllm.json: `bench --engine vllm`'s result (infer/served.py writes it), the export served by vLLM against
vLLM's plain decoding at each batch; read by the served report, the recipe's verdict and doctor."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class Batch(BaseModel):
    model_config = ConfigDict(strict=True)
    tokens_per_s: float = Field(ge=0)
    x_plain: float | None = Field(None, ge=0)       # vLLM plain decoding's tok/s in the same run = 1
    outputs_equal_plain: bool | None = None
    vllm_tau: float | None = None                   # from vLLM's own acceptance counters


class Result(BaseModel):
    model_config = ConfigDict(strict=True)
    method: str
    k: int | None = Field(None, ge=1)
    batches: dict[str, Batch] = Field(min_length=1)


class VllmBenchFile(BaseModel):
    results: dict[str, Result]
    vllm_version: str
    config: dict
    errors: dict[str, str] = {}


def read_report(path: Path) -> dict | None:
    """bench --engine vllm's JSON, its fields checked (the reader's one-line error); None when absent."""
    from specdraft.io import read_model

    if not Path(path).is_file():
        return None
    read_model(path, VllmBenchFile, "vLLM bench", f"re-run `specdraft bench --engine vllm --drafter EXPORT --out {path}`")
    return json.loads(Path(path).read_text())
