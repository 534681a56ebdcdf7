"""The EAGLE-3 checkpoint tensors (canonical speculators names) and the checks export and import run:
the tensors agree with the config, the vocab mapping follows
the offsets convention, the aux layers exist in the verifier. Each failure is one line naming
the tensor or config key and the fix."""

from __future__ import annotations

import torch

from specdraft.errors import SpecdraftError
from specdraft.model.common.checkpoint import check_tensors
from specdraft.model.eagle3.config import DrafterConfig

LAYER = "layers.0."
REQUIRED = ["fc.weight",
            *(f"{LAYER}self_attn.{p}_proj.weight" for p in ("q", "k", "v", "o")),
            *(f"{LAYER}mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
            *(f"{LAYER}{n}.weight" for n in ("input_layernorm", "post_attention_layernorm", "hidden_norm")),
            "norm.weight", "lm_head.weight"]
OPTIONAL = ["embed_tokens.weight", "d2t", "t2d"]  # embed_tokens: vLLM/SGLang share the target's when absent


def expected_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Canonical (speculators) tensor names -> shapes implied by the config."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    q_out = cfg.num_attention_heads * cfg.head_dim
    kv_out = cfg.num_key_value_heads * cfg.head_dim
    n_aux = cfg.num_aux
    fc_norms = {name: (H,) for name in fc_norm_names(cfg)}
    return {
        **fc_norms,
        "embed_tokens.weight": (cfg.vocab_size, H),
        "fc.weight": (H, n_aux * H),
        f"{LAYER}self_attn.q_proj.weight": (q_out, 2 * H),
        f"{LAYER}self_attn.k_proj.weight": (kv_out, 2 * H),
        f"{LAYER}self_attn.v_proj.weight": (kv_out, 2 * H),
        f"{LAYER}self_attn.o_proj.weight": (H, q_out),
        f"{LAYER}mlp.gate_proj.weight": (I, H),
        f"{LAYER}mlp.up_proj.weight": (I, H),
        f"{LAYER}mlp.down_proj.weight": (H, I),
        f"{LAYER}input_layernorm.weight": (H,),
        f"{LAYER}post_attention_layernorm.weight": (H,),
        f"{LAYER}hidden_norm.weight": (H,),
        "norm.weight": (H,),
        "lm_head.weight": (cfg.draft_vocab_size, H),
        "d2t": (cfg.draft_vocab_size,),
        "t2d": (cfg.vocab_size,),
    }


def fc_norm_names(cfg: DrafterConfig) -> list[str]:
    """EAGLE-3.1's per-chunk norms before fc (vLLM's `fc_norm.{i}`), required when config.fc_norm."""
    return [f"fc_norm.{i}.weight" for i in range(cfg.num_aux)] if cfg.fc_norm else []


def validate(tensors: dict[str, torch.Tensor], cfg: DrafterConfig, where: str) -> None:
    """Fail on the first missing, unknown or misshapen tensor, a bad mapping or bad aux ids."""
    check_tensors(tensors, expected_shapes(cfg), REQUIRED + fc_norm_names(cfg), cfg, where,
                  "EAGLE-3 drafter (one decoder layer)")
    ids = list(cfg.aux_layer_ids)        # any count: vLLM sizes fc by len(eagle_aux_hidden_state_layer_ids)
    if ids and cfg.target_num_layers:
        bad = [i for i in ids if not 0 <= i < cfg.target_num_layers]
        if bad:
            raise SpecdraftError(f"{where}: aux layer id(s) {bad} outside the verifier's "
                                 f"{cfg.target_num_layers} layers (valid 0..{cfg.target_num_layers - 1})")
