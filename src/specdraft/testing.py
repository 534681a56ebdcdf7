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
TEMPLATES = {"chatml": CHATML, "chatml-system": CHATML_DEFAULT_SYSTEM, "llama3": LLAMA3, "none": None}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def tiny_tokenizer(template: str = "chatml"):
    """Byte-level tokenizer: 256 byte tokens + a few specials; any text round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(byte_alphabet):
        vocab[ch] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    eos = "<|eot_id|>" if template == "llama3" else "<|im_end|>"
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|begin_of_text|>", eos_token=eos,
                                  pad_token="<|endoftext|>", additional_special_tokens=SPECIALS)
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
    V = target.config.vocab_size
    torch.manual_seed(seed)
    draft_targets = torch.arange(0, V, every)
    drafter = fam.build(fam.new_config(target.config, len(draft_targets), aux_layer_ids))
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_targets] = True
    drafter.init_from_target(target, draft_targets - torch.arange(len(draft_targets)), t2d)
    return drafter
