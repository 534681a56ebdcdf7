"""The speculators (vLLM) layout: config.json with `speculators_model_type: "eagle3"` and the
tensors under their canonical names (`layers.0.*`). vLLM recognises the layout by that key,
reads `transformer_layer_config` as the draft's Llama config, and takes `draft_vocab_size`,
`norm_before_residual` (vLLM assumes True when it is absent, so it is always written),
`norm_output`, `fc_norm` (EAGLE-3.1: tensors `fc_norm.{i}.weight`) and
`eagle_aux_hidden_state_layer_ids` from the top level."""

from __future__ import annotations

from pathlib import Path

from specdraft.errors import SpecdraftError
from specdraft.io import NUMBER, check_fields
from specdraft.model.eagle3.tensors import require_keys
from specdraft.model.eagle3.config import DrafterConfig

MODEL_TYPE = "eagle3"
ARCHITECTURE = "Eagle3Speculator"
SPECULATORS_VERSION = "0.3.0"   # the speculators config schema these files follow
FORMAT_VERSION = 1


def llama_layer_dict(cfg: DrafterConfig, dtype: str) -> dict:
    """The drafter's decoder layer as a 1-layer Llama config dict (target vocab size).

    transformers 5 writes `rope_parameters`; `rope_theta`/`rope_scaling` are added for engines
    still on transformers 4."""
    d = cfg.llama_config().to_dict()
    for noise in ("id2label", "label2id", "architectures"):
        d.pop(noise, None)
    d["dtype"] = d["torch_dtype"] = dtype   # transformers 5 reads dtype, 4 (and SGLang) torch_dtype
    d["rope_theta"] = cfg.rope_theta
    if cfg.rope_scaling:
        d["rope_scaling"] = dict(cfg.rope_scaling)
    return d


def build_config(cfg: DrafterConfig, dtype: str, speculative_tokens: int,
                 verifier_architectures: list[str]) -> dict:
    config = {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                  "verifier_accept_k": 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": cfg.verifier or None, "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": llama_layer_dict(cfg, dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": bool(cfg.norm_before_residual),
        "norm_output": bool(cfg.norm_output),
        "norm_before_fc": False,
        "fc_norm": bool(cfg.fc_norm),
        "embed_requires_grad": not cfg.tie_embeddings_to_target,
        "dtype": dtype,
        "torch_dtype": dtype,
        "specdraft": {"format_version": FORMAT_VERSION, "drafter_config": cfg.to_dict()},
    }
    if cfg.aux_layer_ids:
        config["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layer_ids)
    return config


def rope_from_layer(tl: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from a Llama config dict of transformers 4 or 5."""
    params = dict(tl.get("rope_parameters") or {})
    theta = tl.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = tl.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    if not scaling or scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(theta), scaling


# The fields of a drafter's config.json that parse_config reads: a wrong type (draft_vocab_size "32000")
# is one line naming the file and the field, not a TypeError while the drafter is built
LLAMA_FIELDS = {"hidden_size": int, "intermediate_size": int, "num_attention_heads": int, "num_key_value_heads": int,
                "head_dim": int, "vocab_size": int, "rms_norm_eps": NUMBER, "rope_theta": NUMBER,
                "rope_parameters": dict, "rope_parameters.rope_theta": NUMBER, "rope_scaling": dict,
                "max_position_embeddings": int, "hidden_act": str}


def dataclass_fields(cls, prefix: str) -> dict:
    """check_fields' schema of a config dataclass's fields (int, float, bool, str, list[int], dict)."""
    import types
    import typing

    kinds = {int: int, float: NUMBER, bool: bool, str: str, dict: dict, list: list}
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        if name not in cls.__dataclass_fields__:
            continue
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)   # `dict | None`
        base = next(a for a in typing.get_args(hint) if a is not type(None)) if union else hint
        origin = typing.get_origin(base) or base
        out[f"{prefix}{name}"] = kinds[origin]
        if origin is list:
            out[f"{prefix}{name}.*"] = int
    return out


SPECULATORS_FIELDS = {
    "transformer_layer_config": dict, **{f"transformer_layer_config.{k}": v for k, v in LLAMA_FIELDS.items()},
    "draft_vocab_size": int, "speculators_config": dict, "speculators_config.verifier": dict,
    "speculators_config.verifier.name_or_path": str, "eagle_aux_hidden_state_layer_ids": list,
    "eagle_aux_hidden_state_layer_ids.*": int, "norm_before_fc": bool, "norm_before_residual": bool,
    "norm_output": bool, "fc_norm": bool, "embed_requires_grad": bool, "specdraft": dict,
    **dataclass_fields(DrafterConfig, "specdraft.drafter_config."), "specdraft.drafter_config": dict,
}
FIX = "re-export the drafter or fix config.json"


def config_file(where: str) -> str:
    """The config.json a checkpoint folder's `where` names, for check_fields' one line."""
    return str(Path(where) / "config.json") if not where.endswith("config.json") else where


def drafter_config_from_llama(tl: dict, where: str, **fields) -> DrafterConfig:
    require_keys(tl, ["hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"], where,
                 "the drafter's Llama config must name its shapes")
    theta, scaling = rope_from_layer(tl)
    heads = tl["num_attention_heads"]
    return DrafterConfig(
        hidden_size=tl["hidden_size"], intermediate_size=tl["intermediate_size"], num_attention_heads=heads,
        num_key_value_heads=tl.get("num_key_value_heads") or heads,
        head_dim=tl.get("head_dim") or tl["hidden_size"] // heads, vocab_size=tl["vocab_size"],
        rms_norm_eps=tl.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=tl.get("max_position_embeddings", 4096),
        hidden_act=tl.get("hidden_act", "silu"), **fields)


def parse_config(config: dict, where: str) -> DrafterConfig:
    """DrafterConfig from a speculators config.json (ours round-trips through its "specdraft" block)."""
    check_fields(config, SPECULATORS_FIELDS, config_file(where), FIX)
    require_keys(config, ["transformer_layer_config", "draft_vocab_size", "speculators_config"], where,
                 "re-export the drafter or fix config.json")
    if config.get("norm_before_fc"):
        raise SpecdraftError(f"{where}: norm_before_fc is true (one RMSNorm over all aux states before fc); "
                             "specdraft implements fc_norm (a norm per aux chunk) but not this variant")
    block = config.get("specdraft") or {}
    if block.get("drafter_config"):
        return DrafterConfig.from_dict(block["drafter_config"])
    verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path") or ""
    return drafter_config_from_llama(
        config["transformer_layer_config"], f"{where} transformer_layer_config",
        draft_vocab_size=config["draft_vocab_size"],
        aux_layer_ids=list(config.get("eagle_aux_hidden_state_layer_ids") or []),
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        norm_output=bool(config.get("norm_output", False)),
        fc_norm=bool(config.get("fc_norm", False)),
        tie_embeddings_to_target=not config.get("embed_requires_grad", False),
        verifier=verifier)
