"""P-EAGLE in the speculators layout: EAGLE-3's config.json with `speculators_model_type: "peagle"`
and `mask_token_id` (vLLM's update_peagle maps it to `pard_token` and serves the checkpoint as
PeagleLlamaForCausalLM), and EAGLE-3's tensors plus `mask_hidden` [n_aux * H]."""

from __future__ import annotations

from specdraft.errors import SpecdraftError
from specdraft.model.eagle3 import checkpoint as eagle3_checkpoint
from specdraft.model.eagle3 import tensors as eagle3_tensors
from specdraft.model.peagle.module import PeagleConfig

MODEL_TYPE = "peagle"


def build_config(cfg: PeagleConfig, dtype: str, speculative_tokens: int, verifier_architectures: list[str]) -> dict:
    config = eagle3_checkpoint.build_config(cfg, dtype, speculative_tokens, verifier_architectures)
    config.update({"architectures": ["PeagleSpeculator"], "speculators_model_type": MODEL_TYPE,
                   "mask_token_id": int(cfg.mask_token_id)})
    config["speculators_config"]["algorithm"] = MODEL_TYPE
    return config


def parse_config(config: dict, where: str) -> PeagleConfig:
    if not isinstance(config.get("mask_token_id"), int):
        raise SpecdraftError(f"{where}: config.json field 'mask_token_id' must be a token id (P-EAGLE's mask "
                             f"slots), got {config.get('mask_token_id')!r}; re-export the drafter")
    base = eagle3_checkpoint.parse_config(config, where)
    return PeagleConfig.from_dict({**base.to_dict(), "mask_token_id": config["mask_token_id"]})


def validate(tensors: dict, cfg: PeagleConfig, where: str) -> None:
    mask = tensors.get("mask_hidden")
    n_aux = cfg.num_aux
    if mask is None or tuple(mask.shape) != (n_aux * cfg.hidden_size,):
        raise SpecdraftError(f"{where}: tensor mask_hidden {'missing' if mask is None else list(mask.shape)}; a "
                             f"P-EAGLE drafter needs it as [{n_aux * cfg.hidden_size}] (n_aux x hidden_size)")
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        raise SpecdraftError(f"{where}: mask_token_id {cfg.mask_token_id} outside the target vocab "
                             f"(0..{cfg.vocab_size - 1}); re-export the drafter")
    eagle3_tensors.validate({k: v for k, v in tensors.items() if k != "mask_hidden"}, cfg, where)
