"""What every family's speculators checkpoint shares: the schema version, the decoder layer as a
Llama config dict, rope read back from transformers 4 or 5, the one-line
errors for missing keys and for missing, unknown or misshapen tensors."""

from __future__ import annotations

import torch

from specdraft.errors import SpecdraftError
from specdraft.vocab import check_mapping

SPECULATORS_VERSION = "0.3.0"   # the speculators config schema these files follow
FORMAT_VERSION = 1


def llama_layer_dict(cfg, dtype: str) -> dict:
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


def rope_from_layer(tl: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from a Llama config dict of transformers 4 or 5."""
    params = dict(tl.get("rope_parameters") or {})
    theta = tl.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = tl.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    if not scaling or scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(theta), scaling


def config_from_llama(cls, tl: dict, where: str, **fields):
    """A family's config (`cls`, a BaseConfig) from a 1-layer Llama config dict and the family's fields."""
    require_keys(tl, ["hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"], where,
                 "the drafter's Llama config must name its shapes")
    theta, scaling = rope_from_layer(tl)
    heads = tl["num_attention_heads"]
    return cls(
        hidden_size=tl["hidden_size"], intermediate_size=tl["intermediate_size"], num_attention_heads=heads,
        num_key_value_heads=tl.get("num_key_value_heads") or heads,
        head_dim=tl.get("head_dim") or tl["hidden_size"] // heads, vocab_size=tl["vocab_size"],
        rms_norm_eps=tl.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=tl.get("max_position_embeddings", 4096),
        hidden_act=tl.get("hidden_act", "silu"), **fields)


def check_tensors(tensors: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], required: list[str], cfg,
                  where: str, what: str) -> None:
    """Any family's tensor checks: the first missing, unknown or misshapen tensor (against `shapes`, the
    config's), then the d2t/t2d mapping; one line each naming the tensor and `what` drafter it is."""
    missing = [k for k in required if k not in tensors]
    if missing:
        raise SpecdraftError(f"{where}: missing tensor(s) {', '.join(missing[:5])}; not a complete {what}")
    unknown = sorted(k for k in tensors if k not in shapes)
    if unknown:
        raise SpecdraftError(f"{where}: unexpected tensor(s) {', '.join(unknown[:5])}; expected only the tensors "
                             f"of a {what}")
    for name, t in tensors.items():
        if tuple(t.shape) != shapes[name]:
            raise SpecdraftError(f"{where}: tensor {name} has shape {list(t.shape)} but the config implies "
                                 f"{list(shapes[name])} (hidden_size {cfg.hidden_size}, draft_vocab_size "
                                 f"{cfg.draft_vocab_size}, vocab_size {cfg.vocab_size}); config and weights "
                                 "disagree")
    if "d2t" in tensors:
        check_mapping(tensors["d2t"], tensors.get("t2d"), where, cfg.vocab_size)
    elif cfg.draft_vocab_size != cfg.vocab_size:
        raise SpecdraftError(f"{where}: no d2t tensor but draft_vocab_size {cfg.draft_vocab_size} != vocab_size "
                             f"{cfg.vocab_size}; the draft-to-target mapping is required")


def require_keys(d: dict, keys: list[str], where: str, fix: str) -> None:
    missing = [k for k in keys if d.get(k) is None]
    if missing:
        raise SpecdraftError(f"{where}: missing config key(s) {', '.join(missing)}; {fix}")
