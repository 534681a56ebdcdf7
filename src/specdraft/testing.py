"""Tiny in-process targets for tests and quick experiments: a byte-level tokenizer and a
random Llama, saved as an ordinary Hugging Face folder so every stage loads them like a hub model."""

from __future__ import annotations

from pathlib import Path

import torch

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# SmolLM2-style: injects a default system prompt when the conversation has none.
CHATML_DEFAULT_SYSTEM = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                         "{{ '<|im_start|>system\nYou are a tiny helpful assistant.<|im_end|>\n' }}{% endif %}"
                         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# Thinking templates written for the tests in the formats of the targets users bring (think tags as Qwen3 and
# Kimi write them, gpt-oss's harmony channels): each keeps reasoning only after the last user turn, takes its
# model's template argument, and ends the last assistant turn as the model does.
_LAST_USER = ("{%- set ns = namespace(last_user=-1) -%}{%- for message in messages -%}{%- if message.role == 'user' -%}"
              "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}")
QWEN3_THINK = (_LAST_USER + "{%- for message in messages -%}{%- if message.role == 'assistant' -%}"
               "{{- '<|im_start|>assistant\n' -}}{%- if loop.index0 > ns.last_user -%}"
               "{{- '<think>\n' + (message.reasoning_content or '') + '\n</think>\n\n' -}}{%- endif -%}"
               "{{- message.content + '<|im_end|>\n' -}}{%- else -%}"
               "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}{%- endif -%}"
               "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
               "{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\n\n</think>\n\n' -}}"
               "{%- endif -%}{%- endif -%}")
KIMI_THINK = (_LAST_USER + "{%- for message in messages -%}{%- if message.role == 'system' -%}"
              "{{- '<|im_system|>system<|im_middle|>' + message.content + '<|im_end|>' -}}"
              "{%- elif message.role == 'user' -%}{{- '<|im_user|>user<|im_middle|>' + message.content + '<|im_end|>' -}}"
              "{%- else -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}{%- if loop.index0 > ns.last_user -%}"
              "{{- '<think>' + (message.reasoning_content or '') + '</think>' -}}{%- else -%}{{- '<think></think>' -}}"
              "{%- endif -%}{{- message.content + '<|im_end|>' -}}{%- endif -%}{%- endfor -%}"
              "{%- if add_generation_prompt -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}"
              "{%- if thinking is defined and not thinking -%}{{- '<think></think>' -}}{%- else -%}{{- '<think>' -}}"
              "{%- endif -%}{%- endif -%}")
HARMONY = (_LAST_USER + "{{- '<|start|>system<|message|>You are a tiny assistant.\nReasoning: ' + (reasoning_effort "
           "if reasoning_effort is defined else 'medium') + '<|end|>' -}}{%- for message in messages -%}"
           "{%- if message.role == 'system' -%}{{- '<|start|>developer<|message|>' + message.content + '<|end|>' -}}"
           "{%- elif message.role == 'user' -%}{{- '<|start|>user<|message|>' + message.content + '<|end|>' -}}"
           "{%- else -%}{%- if loop.index0 > ns.last_user and message.thinking -%}"
           "{{- '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' -}}{%- endif -%}"
           "{{- '<|start|>assistant<|channel|>final<|message|>' + message.content -}}"
           "{{- '<|return|>' if loop.last and not add_generation_prompt else '<|end|>' -}}{%- endif -%}{%- endfor -%}"
           "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}")
TEMPLATES = {"chatml": CHATML, "chatml-system": CHATML_DEFAULT_SYSTEM, "llama3": LLAMA3, "none": None,
             "qwen3-think": QWEN3_THINK, "kimi-think": KIMI_THINK, "harmony": HARMONY}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# A thinking template's own special tokens, after the bytes (the ids of the others stay as they were).
TEMPLATE_SPECIALS = {"qwen3-think": ["<think>", "</think>"],
                     "kimi-think": ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<think>",
                                    "</think>"],
                     "harmony": ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"]}
TEMPLATE_EOS = {"llama3": "<|eot_id|>", "harmony": "<|return|>"}


def tiny_tokenizer(template: str = "chatml"):
    """Byte-level tokenizer: 256 byte tokens + a few specials; any text round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(byte_alphabet):
        vocab[ch] = len(vocab)
    extra = TEMPLATE_SPECIALS.get(template, [])
    for t in extra:
        vocab[t] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|begin_of_text|>",
                                  eos_token=TEMPLATE_EOS.get(template, "<|im_end|>"),
                                  pad_token="<|endoftext|>", additional_special_tokens=SPECIALS + extra)
    tok.chat_template = TEMPLATES[template]
    return tok


def tiny_llama(vocab_size: int = 263, hidden_size: int = 64, num_layers: int = 8, num_heads: int = 4,
               num_kv_heads: int = 2, intermediate_size: int = 128, seed: int = 0, tie: bool = False,
               eos_token_id: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                      num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                      intermediate_size=intermediate_size, max_position_embeddings=4096,
                      tie_word_embeddings=tie, eos_token_id=eos_token_id, pad_token_id=0,
                      bos_token_id=3)
    model = LlamaForCausalLM(cfg)
    # Random init gives near-uniform logits; sharpen them so greedy text is non-trivial.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def save_tiny_target(folder: str | Path, template: str = "chatml", **kw) -> Path:
    """Write a tiny random Llama + byte tokenizer as an HF folder and return it."""
    folder = Path(folder)
    tok = tiny_tokenizer(template)
    kw.setdefault("vocab_size", len(tok))
    kw.setdefault("eos_token_id", tok.eos_token_id)
    model = tiny_llama(**kw)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def tiny_drafter_for(target, aux_layer_ids: list[int], every: int = 3, seed: int = 0, family: str | None = None):
    """Random drafter of `family` (the default family when None) over a partial draft vocab (every
    `every`-th target id, so d2t offsets are non-zero), initialised from `target` as training would."""
    from specdraft.families import DEFAULT, family as family_named

    fam = family_named(family or DEFAULT)
    from specdraft.adapter import text_config

    V = text_config(target.config).vocab_size
    torch.manual_seed(seed)
    draft_targets = torch.arange(0, V, every)
    drafter = fam.build(fam.new_config(target.config, len(draft_targets), aux_layer_ids))
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_targets] = True
    drafter.init_from_target(target, draft_targets - torch.arange(len(draft_targets)), t2d)
    return drafter


# --- Tiny random targets of every architecture users bring -------------------------------------
# Each builder returns the kwargs of one text config (hidden 64, 4 heads); wrappers (multimodal
# checkpoints whose language model sits under `text_config`) are built around those in
# `tiny_arch_config`. Special-token ids a wrapper holds (image_token_id etc.) keep their defaults:
# all lie past the tiny vocabulary, so no prompt can contain them and the text path ignores them.

# vLLM's CPU kernels take head sizes of 32..256 (64 here), and its CPU MLA only kv_lora_rank 512 + rope 64.
VLLM_SIZES = {
    "qwen3": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64),
    "qwen3_moe": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64),
    "gpt_oss": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64),
    "deepseek_v3": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=64,
                        kv_lora_rank=512, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, head_dim=64),
}
TINY_ARCHS: tuple[str, ...] = ("llama", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_k25", "gpt_oss",
                               "gemma3_text", "gemma3", "qwen2_5_vl", "llama4")
_TINY_VISION = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2)


def _alternating(n: int, other: str) -> list[str]:
    """`other` on even layers, full attention on odd ones (so n >= 2 has both kinds)."""
    return [other if i % 2 == 0 else "full_attention" for i in range(n)]


def _deepseek_v3(n: int, sw: int) -> dict:
    return dict(model_type="deepseek_v3", num_key_value_heads=4, first_k_dense_replace=1, n_routed_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, n_group=1, topk_group=1,
                q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                head_dim=8, topk_method="noaux_tc", scoring_func="sigmoid")   # the real config's routing keys (vLLM reads them)


def _gemma3_text(n: int, sw: int) -> dict:
    return dict(model_type="gemma3_text", head_dim=16, sliding_window=sw,
                layer_types=_alternating(n, "sliding_attention"))


_TEXT = {
    "llama": lambda n, sw: dict(model_type="llama"),
    "qwen3": lambda n, sw: dict(model_type="qwen3", head_dim=16, tie_word_embeddings=True),
    "qwen3_moe": lambda n, sw: dict(model_type="qwen3_moe", head_dim=16, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=32),
    "deepseek_v3": _deepseek_v3,
    "kimi_k25": _deepseek_v3,
    "gpt_oss": lambda n, sw: dict(model_type="gpt_oss", head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                  sliding_window=sw, layer_types=_alternating(n, "sliding_attention")),
    "gemma3_text": _gemma3_text,
    "gemma3": _gemma3_text,
    "qwen2_5_vl": lambda n, sw: dict(model_type="qwen2_5_vl_text",
                                     rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
    # NoPE layers use full attention, the others chunked attention of attention_chunk_size.
    "llama4": lambda n, sw: dict(model_type="llama4_text", head_dim=16, num_local_experts=2, num_experts_per_tok=1,
                                 intermediate_size_mlp=128, attention_chunk_size=sw, no_rope_layer_interval=2),
}

_WRAPPERS = {
    "kimi_k25": lambda text: dict(text_config=text, vision_config=_TINY_VISION, projection_hidden_size=64,
                                  tie_word_embeddings=False, architectures=["Kimi_K25ForConditionalGeneration"]),
    "gemma3": lambda text: dict(text_config=text, vision_config=dict(_TINY_VISION, image_size=28, patch_size=14),
                                mm_tokens_per_image=4),
    "qwen2_5_vl": lambda text: dict(text_config=text, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64,
                                                                         num_heads=2, out_hidden_size=64)),
    "llama4": lambda text: dict(text_config=text, vision_config=dict(
        _TINY_VISION, image_size=28, patch_size=14, vision_output_dim=32, projector_input_dim=32,
        projector_output_dim=32)),
}


def tiny_arch_config(arch: str, vocab_size: int, num_layers: int = 4, sliding_window: int = 8,
                     eos_token_id: int | None = None, text: dict | None = None):
    """Config of a tiny random `arch` target (one of TINY_ARCHS) with the tiny tokenizer's special ids
    (eos defaults to the chatml tokenizer's); `text` overrides fields of the language model's config
    (VLLM_SIZES: the head sizes vLLM's CPU kernels take)."""
    overrides = text or {}
    from transformers import CONFIG_MAPPING

    ids = dict(eos_token_id=SPECIALS.index("<|im_end|>") if eos_token_id is None else eos_token_id,
               pad_token_id=SPECIALS.index("<|endoftext|>"), bos_token_id=SPECIALS.index("<|begin_of_text|>"))
    text = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=num_layers, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, max_position_embeddings=4096, **ids)
    text.update(_TEXT[arch](num_layers, sliding_window))
    text.update(overrides)
    text_config = CONFIG_MAPPING[text.pop("model_type")](**text)
    if arch not in _WRAPPERS:
        return text_config
    return CONFIG_MAPPING[arch](**_WRAPPERS[arch](text_config.to_dict()), **ids)


def tiny_arch_model(arch: str, vocab_size: int, num_layers: int = 4, sliding_window: int = 8, seed: int = 0,
                    eos_token_id: int | None = None, text: dict | None = None):
    """Random `arch` model in eval mode; wrappers load as image-text-to-text models, the rest as causal LMs."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from specdraft.adapter import decoder

    cfg = tiny_arch_config(arch, vocab_size, num_layers, sliding_window, eos_token_id, text)
    auto = AutoModelForImageTextToText if hasattr(cfg, "text_config") else AutoModelForCausalLM
    torch.manual_seed(seed)
    model = auto.from_config(cfg, dtype=torch.float32)
    # Random init gives near-uniform logits and a residual stream that drifts to one shared direction:
    # sharpen the head and let the token embeddings dominate, so greedy text is non-trivial. A tied head,
    # sharpened, would only repeat the last token: give the final norm random signed gains instead.
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    with torch.no_grad():
        if head is embed:
            decoder(model).norm.weight.normal_(0.0, 8.0)
        else:
            head.mul_(8.0)
            embed.mul_(4.0)
    return model.eval()


def save_tiny_arch(folder: str | Path, arch: str, template: str = "chatml", **kw) -> Path:
    """Write a tiny random `arch` target + byte tokenizer as an HF folder and return it."""
    folder = Path(folder)
    tok = tiny_tokenizer(template)
    kw.setdefault("vocab_size", len(tok))
    kw.setdefault("eos_token_id", tok.eos_token_id)
    model = tiny_arch_model(arch, **kw)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
