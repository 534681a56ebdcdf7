"""The target adapter: what specdraft needs to know of a target's architecture, the twin of the
drafter families (families.py). It answers from transformers' own objects wherever they can answer
(the text config, the decoder and its layers, the embeddings and head, the final norm module,
`layer_types`, the conversion mapping of checkpoint names) and from ARCHITECTURES, one entry per
architecture, only where they cannot (chat-template style, end tokens, whether vLLM serves an EAGLE-3
drafter for it). Nothing outside this module names an architecture: a new one is an entry here, and a
tiny config of it in testing.TINY_ARCHS runs the suite's per-architecture tests (test_architectures.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specdraft.errors import SpecdraftError


@dataclass(frozen=True)
class Architecture:
    """What transformers' objects do not say about an architecture."""

    name: str
    thinking: str = ""                                  # its chat format's reasoning: "think-tags", "harmony", ""
    template_kwargs: tuple[str, ...] = ()               # the chat-template arguments it documents
    end_tokens: tuple[str, ...] = ()                    # tokens that end an assistant turn besides eos
    vllm_serves_drafters: bool = True                   # vLLM 0.32 serves an EAGLE-3 drafter against it


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("llama"),
    Architecture("qwen3", thinking="think-tags", template_kwargs=("enable_thinking",)),
    Architecture("qwen3_moe", thinking="think-tags", template_kwargs=("enable_thinking",)),
    Architecture("deepseek_v3"),
    Architecture("kimi_k25", thinking="think-tags", template_kwargs=("thinking",)),
    Architecture("gpt_oss", thinking="harmony", template_kwargs=("reasoning_effort",),
                 end_tokens=("<|return|>", "<|call|>")),
    Architecture("gemma3_text", vllm_serves_drafters=False),
    Architecture("gemma3", vllm_serves_drafters=False),
    Architecture("qwen2_5_vl"),
    Architecture("llama4"),
)}


def architecture(cfg) -> Architecture:
    """The table's entry for a config (by its top-level model_type); an unknown one gets the defaults."""
    kind = getattr(cfg, "model_type", None) or "?"
    return ARCHITECTURES.get(kind) or Architecture(kind, vllm_serves_drafters=False)


# ---------------------------------------------------------------------------- config


def text_config(cfg):
    """The decoder's config: the config itself for a causal LM, its `text_config` for a vision-language
    wrapper (Kimi-K2.5, Qwen2.5-VL, Gemma 3 4B+, Llama 4): the sizes specdraft reads live there."""
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg


def is_wrapper(cfg) -> bool:
    return text_config(cfg) is not cfg


def auto_class(cfg):
    """The transformers auto class that loads the target: a vision-language wrapper as itself (its
    language model answers text-only calls), anything else as a causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_wrapper(cfg) else AutoModelForCausalLM


def check_supported(cfg, model: str) -> None:
    """A decoder-only language model, or a vision-language wrapper of one, with at least 3 layers;
    anything else refused in one line, from the config, before any weights load."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    kind = getattr(cfg, "model_type", None) or "?"
    where = f"--model {model}: {kind}"
    if getattr(cfg, "is_encoder_decoder", False):
        raise SpecdraftError(f"{where} is an encoder-decoder model; specdraft drafts for decoder-only "
                             "language models (Llama, Qwen, DeepSeek, Kimi, ...): pass one of those")
    # BERT-family configs carry is_decoder/add_cross_attention: bidirectional encoders unless is_decoder
    if getattr(cfg, "is_decoder", None) is False and hasattr(cfg, "add_cross_attention"):
        raise SpecdraftError(f"{where} is a bidirectional encoder, not a causal LM; specdraft drafts for "
                             "decoder-only language models (Llama, Qwen, DeepSeek, Kimi, ...): pass one of those")
    auto_map = getattr(cfg, "auto_map", None) or {}
    remote = any(k in auto_map for k in ("AutoModelForCausalLM", "AutoModelForImageTextToText"))
    known = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if is_wrapper(cfg) else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if kind not in known and not remote:
        raise SpecdraftError(f"{where} has no causal-LM or vision-language class in transformers; specdraft "
                             "drafts for decoder-only language models (Llama, Qwen, DeepSeek, Kimi, ...): pass one of those")
    if getattr(text_config(cfg), "final_logit_softcapping", None):
        raise SpecdraftError(f"{where} caps its final logits (final_logit_softcapping), which specdraft's teacher "
                             "does not model yet; train a drafter for it with a tool that does")
    layers = getattr(text_config(cfg), "num_hidden_layers", None)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 3:
        raise SpecdraftError(f"{where} has num_hidden_layers {layers!r}; the default capture taps 3 aux layers, so the "
                             "target needs at least 3 decoder layers: pass a deeper target (or fix config.json)")


def layer_types(cfg) -> list[str]:
    """Each decoder layer's attention: "full_attention", "sliding_attention" or "chunked_attention"
    (transformers' `layer_types`; a config without it is full attention everywhere)."""
    tc = text_config(cfg)
    return list(getattr(tc, "layer_types", None) or ["full_attention"] * tc.num_hidden_layers)


def moe(cfg) -> bool:
    tc = text_config(cfg)
    return any((getattr(tc, k, None) or 0) > 1 for k in ("n_routed_experts", "num_experts", "num_local_experts"))


def mla(cfg) -> bool:
    return bool(getattr(text_config(cfg), "kv_lora_rank", None))


# ---------------------------------------------------------------------------- aux layers


def default_aux_layers(num_layers: int) -> list[int]:
    """Three distinct layer ids on any depth: vLLM's (2, L//2, L-3) where those are distinct (7+ layers),
    else the three nearest the middle of 1..L-1 (0, the embeddings, only for a 3-layer target)."""
    ids = [2, num_layers // 2, num_layers - 3]
    if len(set(ids)) == 3 and min(ids) >= 0:
        return ids
    pool = list(range(1, num_layers)) if num_layers >= 4 else list(range(num_layers))
    middle = (num_layers - 1) / 2
    return sorted(sorted(pool, key=lambda l: (abs(l - middle), -l))[:3])


# ---------------------------------------------------------------------------- modules of a loaded target


def decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The language model's decoder (it holds `layers` and the final `norm`): transformers' get_decoder()
    for a causal LM and for a vision-language wrapper alike."""
    m = model
    for _ in range(4):                  # Llama 4's wrapper -> its Llama4ForCausalLM -> that one's decoder
        if hasattr(m, "layers"):
            return m
        inner = m.get_decoder() if hasattr(m, "get_decoder") else None
        inner = inner if inner is not None and inner is not m else getattr(m, "model", None)
        if not isinstance(inner, torch.nn.Module) or inner is m:
            break
        m = inner
    return m


def final_norm(model: torch.nn.Module) -> tuple[torch.Tensor, float]:
    """(weight [H], eps) such that rms_norm(x, weight, eps) is the target's own final norm: its module is
    probed once to tell Llama's x·w from Gemma's x·(1+w) (then the weight is 1+w). Teacher logits =
    lm_head(rms_norm(last, weight, eps)) (a softcapped head is refused by check_supported)."""
    norm, eps, offset = final_norm_form(model)
    return (norm.weight.detach() + offset if offset else norm.weight), eps


def final_norm_form(model: torch.nn.Module) -> tuple[torch.nn.Module, float, float]:
    """(the final norm module, its eps, its weight offset: 0 for x·w, 1 for Gemma's x·(1+w)). The offset
    holds for the decoder layers' norms of the same architecture too."""
    norm = getattr(decoder(model), "norm", None)
    if norm is None or getattr(norm, "weight", None) is None:
        raise SpecdraftError(f"{type(model).__name__}: no final norm found (its decoder's `norm`); "
                             "specdraft supports decoder-only targets with a final RMSNorm")
    eps = float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None)
                or getattr(text_config(model.config), "rms_norm_eps", 1e-6))
    return norm, eps, norm_offset(norm, eps)


def norm_offset(norm: torch.nn.Module, eps: float) -> float:
    """0 for a norm computing rms_norm(x)·w, 1 for rms_norm(x)·(1+w), measured on a probe input."""
    w = norm.weight.detach().float()
    with torch.no_grad():
        probe = torch.ones(1, w.numel(), dtype=norm.weight.dtype, device=w.device)
        out = norm(probe).float()[0] * math.sqrt(1 + eps)                       # = the effective weight
    for offset in (0.0, 1.0):
        if torch.allclose(out, w + offset, rtol=2e-2, atol=2e-2):
            return offset
    raise SpecdraftError(f"{type(norm).__name__}: the final norm is neither x·w nor x·(1+w) after RMS "
                         "normalisation; specdraft cannot compute its teacher: add an entry to adapter.py")


# ---------------------------------------------------------------------------- verify masks


@dataclass
class MaskPlan:
    """How a target takes a verify forward's mask: one bool or additive mask, or one per layer type."""

    types: list[str]                                    # the distinct layer types, in layer order
    window: int | None = None                           # sliding_attention's window
    chunk: int | None = None                            # chunked_attention's chunk size
    additive: bool = False                              # eager attention adds the mask to the scores
    per_type: bool = False                              # the decoder takes {layer type: mask}
    dtype: torch.dtype = torch.float32
    refusal: str = field(default="")                    # why this loop cannot run the target, if it cannot


def mask_plan(model: torch.nn.Module) -> MaskPlan:
    cfg = model.config
    tc = text_config(cfg)
    types = list(dict.fromkeys(layer_types(cfg)))
    impl = getattr(cfg, "_attn_implementation", None) or "sdpa"
    plan = MaskPlan(types=types, window=getattr(tc, "sliding_window", None),
                    chunk=getattr(tc, "attention_chunk_size", None), additive=impl == "eager",
                    per_type=types != ["full_attention"], dtype=next(model.parameters()).dtype)
    unknown = [t for t in types if t not in ("full_attention", "sliding_attention", "chunked_attention")]
    if unknown:
        plan.refusal = (f"{type(model).__name__}: attention type {unknown[0]!r} is not one the verify loop masks; "
                        "add it to adapter.verify_mask")
    elif "sliding_attention" in types and not plan.window:
        plan.refusal = f"{type(model).__name__}: sliding attention without a sliding_window in its config"
    elif "chunked_attention" in types and not plan.chunk:
        plan.refusal = f"{type(model).__name__}: chunked attention without an attention_chunk_size in its config"
    return plan


def verify_mask(plan: MaskPlan, visible: torch.Tensor, q_pos: torch.Tensor, kv_pos: torch.Tensor):
    """The attention_mask argument of a verify forward. visible bool [T, S] (which cache slots each row
    may see: causal and tree structure), q_pos [T] each row's position, kv_pos [S] each slot's. Sliding
    and chunked layers see the slots their rule keeps (transformers' masking_utils overlays, by position);
    eager attention gets an additive float mask (it adds a bool mask to the scores, masking nothing)."""
    masks = {}
    for kind in plan.types:
        keep = visible
        if kind == "sliding_attention":
            keep = visible & (kv_pos[None, :] > q_pos[:, None] - plan.window)
        elif kind == "chunked_attention":
            keep = visible & (kv_pos[None, :] // plan.chunk == q_pos[:, None] // plan.chunk)
        keep = keep[None, None]                                                   # [1, 1, T, S]
        if plan.additive:
            keep = torch.zeros(keep.shape, dtype=plan.dtype, device=keep.device).masked_fill(
                ~keep, torch.finfo(plan.dtype).min)
        masks[kind] = keep
    return masks if plan.per_type else masks["full_attention"]


# ---------------------------------------------------------------------------- the checkpoint's names


@dataclass
class CheckpointNames:
    """Where a checkpoint keeps what specdraft reads without loading the model, found through
    transformers' own conversion mapping (a Kimi-K2.5 checkpoint stores `language_model.model.*`)."""

    embed: str                                          # the input embeddings' tensor
    norm: str                                           # the final norm's weight
    head: str | None                                    # lm_head's weight; None where tied to embed
    layers: dict[str, str]                              # canonical "model.layers.N.rest" -> checkpoint key


def meta_model(cfg) -> torch.nn.Module:
    """The model transformers builds from `cfg`, on the meta device (no memory, no weights). A config made by
    the model's own code (`transformers_modules`) was loaded with --trust-remote-code: its model class too."""
    remote = type(cfg).__module__.startswith("transformers_modules")
    with torch.device("meta"):
        return auto_class(cfg).from_config(cfg, trust_remote_code=remote)


def checkpoint_names(cfg, keys: list[str]) -> CheckpointNames:
    """Map a checkpoint's tensor names onto the model transformers would build from `cfg` (on the meta
    device: no weights), then name embeddings, final norm, head and every decoder layer's tensor. A pure
    function of the config and the names, so kept per process (describe_target, then load_target_head,
    ask for the same)."""
    key = (cfg.to_json_string(use_diff=False), tuple(keys))
    if key not in NAMES_SEEN:
        NAMES_SEEN[key] = mapped_names(cfg, keys)
    return NAMES_SEEN[key]


NAMES_SEEN: dict[tuple, CheckpointNames] = {}


def mapped_names(cfg, keys: list[str]) -> CheckpointNames:
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    model = meta_model(cfg)
    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    module_names = {id(m): name for name, m in model.named_modules()}
    dec = decoder(model)
    embed = module_names[id(model.get_input_embeddings())] + ".weight"
    norm = module_names[id(dec.norm)] + ".weight"
    head = module_names[id(model.get_output_embeddings())] + ".weight"
    layers = module_names[id(dec.layers)] + "."
    by_model: dict[str, str] = {}
    for key in keys:
        by_model.setdefault(rename_source_key(key, renamings, [])[0], key)
    tied = bool(getattr(text_config(cfg), "tie_word_embeddings", False) or getattr(cfg, "tie_word_embeddings", False)) \
        and head not in by_model
    missing = [n for n in (embed, norm) + (() if tied else (head,)) if n not in by_model]
    if missing:
        raise SpecdraftError(f"the checkpoint (read through transformers' conversion mapping of "
                             f"{type(model).__name__}) has no tensor {missing[0]}; use --engine hf")
    return CheckpointNames(embed=by_model[embed], norm=by_model[norm], head=None if tied else by_model[head],
                           layers={"model.layers." + k.removeprefix(layers): ckpt for k, ckpt in by_model.items()
                                   if k.startswith(layers)})


def final_norm_module(cfg, weight: torch.Tensor) -> torch.nn.Module:
    """The target's own final norm module (its class, built from `cfg`) holding `weight`: a TargetHead
    computes exactly what the model computes."""
    norm = decoder(meta_model(cfg)).norm
    norm.to_empty(device=weight.device)
    norm.weight = torch.nn.Parameter(weight, requires_grad=False)
    return norm.to(weight.dtype)


# ---------------------------------------------------------------------------- the drafter's shape


def drafter_shape(cfg) -> dict:
    """The drafter's decoder-layer shape for this target: its own attention and MLP sizes where it is a
    dense Llama-like model; for MLA targets full heads of v_head_dim (the rope part is config.head_dim
    there), and for MoE targets a dense MLP as wide as the target's dense layers, or what one token runs
    through its experts where it has none (public Kimi-K2.5 drafters: head_dim 128, intermediate 12288)."""
    tc = text_config(cfg)
    heads = tc.num_attention_heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    kv = getattr(tc, "num_key_value_heads", None) or heads
    if mla(cfg):
        head_dim = getattr(tc, "v_head_dim", None) or tc.hidden_size // heads
    inter = getattr(tc, "intermediate_size", None)
    if moe(cfg):
        dense = getattr(tc, "intermediate_size_mlp", None) or \
            (inter if (getattr(tc, "first_k_dense_replace", 0) or getattr(tc, "mlp_only_layers", None)) else None)
        per_token = (getattr(tc, "moe_intermediate_size", None) or inter or 4 * tc.hidden_size) * \
            (getattr(tc, "num_experts_per_tok", None) or 1)
        inter = dense or per_token
    return {"hidden_size": tc.hidden_size, "num_attention_heads": heads, "num_key_value_heads": kv,
            "head_dim": int(head_dim), "intermediate_size": int(inter or 4 * tc.hidden_size)}


# ---------------------------------------------------------------------------- the cost model


def active_fraction(cfg) -> float:
    """The share of an MoE layer's expert weights one token reads (experts per token / experts); 1 for a
    dense target. A CPU verify of a few rows streams the experts its rows route to, not all of them."""
    tc = text_config(cfg)
    experts = next((getattr(tc, k) for k in ("n_routed_experts", "num_experts", "num_local_experts")
                    if getattr(tc, k, None)), None)
    per_token = getattr(tc, "num_experts_per_tok", None)
    return per_token / experts if experts and per_token else 1.0


def is_expert_weight(name: str) -> bool:
    """A routed expert's weight, by its parameter name in transformers' MoE modules."""
    return ".experts." in name and ".shared_expert" not in name


def engines_line(cfg) -> str:
    """Which engines run this target with a specdraft drafter (what `info` prints)."""
    arch = architecture(cfg)
    hf = "transformers (every stage)"
    if arch.name not in ARCHITECTURES:
        return f"{hf}; vLLM: not tested with this architecture"
    if not arch.vllm_serves_drafters:
        return f"{hf}; vLLM 0.32 runs it for data but serves no EAGLE-3 drafter against it"
    return f"{hf}; vLLM 0.32 (data, capture, serving an EAGLE-3 export)"
