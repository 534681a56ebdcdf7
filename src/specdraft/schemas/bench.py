"""RUN/bench.json, bench_natural.json (and any bench --out): the loop's speed and τ per method (infer/bench.py
writes it). Read by the report, the model card and the recipe's closing lines."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr


class FastestPlain(BaseModel):
    """Outside float32, plain decoding at its own R (the "x plain" baseline), beside plain at the chains' R."""
    model_config = ConfigDict(strict=True, extra="allow")
    rows: StrictInt | None = None
    tokens_per_s: float | None = None
    speedup: float | None = None                  # over transformers' greedy generate
    speedup_over_plain: float | None = None       # 1.0 where it is the baseline


class MethodResult(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    tokens_per_s: float | None = None
    speedup: float | None = None                  # over transformers' greedy generate
    speedup_over_plain: float | None = None       # over plain decoding in specdraft's loop
    accept_len: float | None = None               # τ
    per_position_accept: list[float] | None = None
    identical_to_greedy: StrictBool | None = None
    prompts_identical: StrictInt | None = None
    by_context: dict | None = None
    fastest: FastestPlain | None = None           # plain's only: its speed run at its own R (outside float32)


class BenchConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    num_prompts: StrictInt | None = None
    prompts: StrictStr | None = None
    k: StrictInt | StrictStr | None = None        # the K run, or "auto" where none was chosen
    device: StrictStr | None = None
    model: StrictStr | None = None
    max_new_tokens: StrictInt | None = None
    dtype: StrictStr | None = None


class BenchFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    config: BenchConfig = BenchConfig()
    methods: dict[str, MethodResult] = {}
