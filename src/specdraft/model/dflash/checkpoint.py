"""DFlash in the speculators layout, as vLLM 0.32 reads it (update_dflash, qwen3_dflash.py):
config.json with `speculators_model_type: "dflash"`, `aux_hidden_state_layer_ids` (the target's
hidden_states indices, as our aux ids; vLLM subtracts 1 for its target_layer_ids), `mask_token_id`,
`sample_from_anchor: false` (the anchor is the bonus token; the K mask slots draft) and a Qwen3
`transformer_layer_config` (q_norm/k_norm per head; `num_hidden_layers` = the draft's layers).
Tensors: fc, hidden_norm, layers.{i}.*, norm, lm_head, d2t/t2d, and embed_tokens unless dropped
(vLLM then shares the target's)."""

from __future__ import annotations

from specdraft.errors import SpecdraftError
from specdraft.model.dflash.module import DFlashConfig
from specdraft.model.common import checkpoint as common
from specdraft.schemas.drafter import DrafterConfigFile, check_drafter_config

MODEL_TYPE = "dflash"


class DFlashFile(DrafterConfigFile):
    """A DFlash config.json: the shared fields (schemas/drafter.py) and the block's."""
    aux_hidden_state_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    sample_from_anchor: bool | None = None
    block_size: int | None = None


def layer_dict(cfg: DFlashConfig, dtype: str) -> dict:
    """The draft's decoder stack as a Qwen3 config dict (what DFlashQwen3ForCausalLM builds from)."""
    from transformers import Qwen3Config

    d = common.llama_layer_dict(cfg, dtype)
    qwen = Qwen3Config(**{k: v for k, v in d.items() if k not in ("model_type", "transformers_version", "num_hidden_layers")},
                       num_hidden_layers=cfg.num_layers, use_sliding_window=False).to_dict()
    for noise in ("id2label", "label2id", "architectures"):
        qwen.pop(noise, None)
    qwen.update({"dtype": dtype, "torch_dtype": dtype, "rope_theta": cfg.rope_theta})
    return qwen


def build_config(cfg: DFlashConfig, dtype: str, speculative_tokens: int, verifier_architectures: list[str]) -> dict:
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": common.SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                  "verifier_accept_k": 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": cfg.verifier or None, "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": layer_dict(cfg, dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.hidden_size,
        "aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "mask_token_id": int(cfg.mask_token_id),
        "sample_from_anchor": False,
        "sliding_window_non_causal": True,         # the block attends both ways, as trained
        "block_size": int(cfg.block_size),
        "dtype": dtype,
        "torch_dtype": dtype,
        "specdraft": {"format_version": common.FORMAT_VERSION, "drafter_config": cfg.to_dict()},
    }


def parse_config(config: dict, where: str, schema: type[DFlashFile] = DFlashFile,
                 config_type: type = DFlashConfig) -> DFlashConfig:
    """DFlashConfig from its config.json (checked as `schema`, its block as `config_type`: DSpark's reads it too)."""
    check_drafter_config(config, where, schema, config_type)
    common.require_keys(config, ["transformer_layer_config", "draft_vocab_size", "aux_hidden_state_layer_ids",
                                 "mask_token_id"], where,
                        "a DFlash drafter names them; re-export it or fix config.json")
    if config.get("sample_from_anchor"):
        raise SpecdraftError(f"{where}: sample_from_anchor is true (the anchor's row drafts too); specdraft's "
                             "DFlash drafts from the mask slots only")
    block = (config.get("specdraft") or {}).get("drafter_config")
    if block:
        return DFlashConfig.from_dict(block)
    layer = config["transformer_layer_config"]
    return common.config_from_llama(
        DFlashConfig, layer, f"{where} transformer_layer_config", draft_vocab_size=config["draft_vocab_size"],
        aux_layer_ids=list(config["aux_hidden_state_layer_ids"]),
        verifier=((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path") or "",
        num_layers=layer.get("num_hidden_layers", 1), mask_token_id=config["mask_token_id"],
        block_size=config.get("block_size", 16))


def expected_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    H, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = {"embed_tokens.weight": (cfg.vocab_size, H), "fc.weight": (H, cfg.num_aux * H),
              "hidden_norm.weight": (H,), "norm.weight": (H,), "lm_head.weight": (cfg.draft_vocab_size, H),
              "d2t": (cfg.draft_vocab_size,), "t2d": (cfg.vocab_size,)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update({f"{p}self_attn.q_proj.weight": (q_out, H), f"{p}self_attn.k_proj.weight": (kv_out, H),
                       f"{p}self_attn.v_proj.weight": (kv_out, H), f"{p}self_attn.o_proj.weight": (H, q_out),
                       f"{p}self_attn.q_norm.weight": (hd,), f"{p}self_attn.k_norm.weight": (hd,),
                       f"{p}mlp.gate_proj.weight": (I, H), f"{p}mlp.up_proj.weight": (I, H),
                       f"{p}mlp.down_proj.weight": (H, I), f"{p}input_layernorm.weight": (H,),
                       f"{p}post_attention_layernorm.weight": (H,)})
    return shapes


OPTIONAL = ("embed_tokens.weight", "d2t", "t2d")   # embed_tokens: vLLM shares the target's when absent


def validate(tensors: dict, cfg: DFlashConfig, where: str) -> None:
    """Fail on the first missing, unknown or misshapen tensor, a bad mapping, mask token or aux id."""
    shapes = expected_shapes(cfg)
    common.check_tensors(tensors, shapes, [k for k in shapes if k not in OPTIONAL], cfg, where,
                         f"{cfg.num_layers}-layer DFlash drafter")
    check_block_config(cfg, where)


def check_block_config(cfg: DFlashConfig, where: str) -> None:
    """The mask token inside the target vocab, and aux ids inside the target's layers (DSpark's too)."""
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        raise SpecdraftError(f"{where}: mask_token_id {cfg.mask_token_id} outside the target vocab "
                             f"(0..{cfg.vocab_size - 1}); re-export the drafter")
    bad = [i for i in cfg.aux_layer_ids if cfg.target_num_layers and not 0 <= i < cfg.target_num_layers]
    if not cfg.aux_layer_ids or bad:
        raise SpecdraftError(f"{where}: aux_hidden_state_layer_ids {list(cfg.aux_layer_ids)}: DFlash needs the "
                             f"target layers it reads, each in 0..{max(cfg.target_num_layers - 1, 0)}")
