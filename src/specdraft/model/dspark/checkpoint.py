"""DSpark in the speculators layout, as vLLM 0.32 reads it (update_dspark, qwen3_dspark.py): DFlash's
config.json (model/dflash/checkpoint.py) with `speculators_model_type: "dspark"`, architectures
`Qwen3DSparkModel`, and the DSpark fields vLLM copies: `block_size`, `markov_rank`,
`markov_head_type` ("vanilla"), `enable_confidence_head`, `confidence_head_with_markov`,
`mask_token_id`. `aux_hidden_state_layer_ids` are our ids (hidden_states indices); vLLM's
`target_layer_ids` are those minus one (DSpark's i-1 layer semantics). `sample_from_anchor: false`:
the speculators 1+N fill-in block, the anchor a bonus token and the N mask slots drafting.
Tensors: DFlash's plus markov_head.markov_w1 [V, r], markov_head.markov_w2 [Vd, r] and, with the
confidence head, confidence_head.proj.weight [1, H (+r)] and .bias [1]."""

from __future__ import annotations

from specdraft.errors import SpecdraftError
from specdraft.model.common import checkpoint as common
from specdraft.model.dflash import checkpoint as dflash_checkpoint
from specdraft.model.dspark.module import DSparkConfig

MODEL_TYPE = "dspark"
ARCHITECTURE = "Qwen3DSparkModel"
MARKOV_HEAD_TYPES = ("vanilla",)


class DSparkFile(dflash_checkpoint.DFlashFile):
    """A DSpark config.json: DFlash's fields and the Markov and confidence heads'."""
    markov_rank: int | None = None
    markov_head_type: str | None = None
    enable_confidence_head: bool | None = None
    confidence_head_with_markov: bool | None = None


def build_config(cfg: DSparkConfig, dtype: str, speculative_tokens: int, verifier_architectures: list[str]) -> dict:
    config = dflash_checkpoint.build_config(cfg, dtype, speculative_tokens, verifier_architectures)
    config.pop("sliding_window_non_causal")      # a DFlash field; DSpark's layers are full attention, non-causal
    config.update({"architectures": [ARCHITECTURE], "speculators_model_type": MODEL_TYPE,
                   "markov_rank": int(cfg.markov_rank), "markov_head_type": cfg.markov_head_type,
                   "enable_confidence_head": bool(cfg.enable_confidence_head),
                   "confidence_head_with_markov": bool(cfg.confidence_head_with_markov)})
    config["speculators_config"]["algorithm"] = MODEL_TYPE
    return config


def parse_config(config: dict, where: str) -> DSparkConfig:
    base = dflash_checkpoint.parse_config(config, where, DSparkFile, DSparkConfig)    # the schema's check, DFlash's fields
    if config.get("markov_rank") is None:
        raise SpecdraftError(f"{where}: missing config key markov_rank; a DSpark drafter names its Markov head's "
                             "rank; re-export it or fix config.json")
    if config.get("markov_head_type", "vanilla") not in MARKOV_HEAD_TYPES:
        raise SpecdraftError(f"{where}: markov_head_type {config['markov_head_type']!r}: specdraft (like vLLM "
                             "0.32) serves 'vanilla' only; fix config.json")
    block = (config.get("specdraft") or {}).get("drafter_config")
    fields = block if block else {**base.to_dict(), "markov_rank": config["markov_rank"],
                                  "markov_head_type": config.get("markov_head_type", "vanilla"),
                                  "enable_confidence_head": config.get("enable_confidence_head", False),
                                  "confidence_head_with_markov": config.get("confidence_head_with_markov", False)}
    return DSparkConfig.from_dict(fields)


def expected_shapes(cfg: DSparkConfig) -> dict[str, tuple[int, ...]]:
    shapes = dflash_checkpoint.expected_shapes(cfg)
    shapes.update({"markov_head.markov_w1.weight": (cfg.vocab_size, cfg.markov_rank),
                   "markov_head.markov_w2.weight": (cfg.draft_vocab_size, cfg.markov_rank)})
    if cfg.enable_confidence_head:
        width = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_head_with_markov else 0)
        shapes.update({"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)})
    return shapes


def validate(tensors: dict, cfg: DSparkConfig, where: str) -> None:
    """DFlash's checks (mask token, aux ids) plus the Markov and confidence heads' tensors."""
    shapes = expected_shapes(cfg)
    common.check_tensors(tensors, shapes, [k for k in shapes if k not in dflash_checkpoint.OPTIONAL], cfg, where,
                         f"{cfg.num_layers}-layer DSpark drafter (markov_rank {cfg.markov_rank}, confidence head "
                         f"{'on' if cfg.enable_confidence_head else 'off'})")
    dflash_checkpoint.check_block_config(cfg, where)
