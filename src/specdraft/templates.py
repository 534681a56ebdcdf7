"""What a target's chat template writes, read from the template and the tokenizer (no weights): its
thinking style (think tags as Qwen3 and Kimi write them, or gpt-oss's harmony channels), the message
field it renders reasoning from, whether it reasons by default with given template arguments, and
which arguments it reads (vLLM's `chat_template_kwargs`). data/render.py renders with it; `info` says it.
"""

from __future__ import annotations

import hashlib
import json
import re

from specdraft.errors import SpecdraftError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
HARMONY = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")
TEMPLATE_OWN = ("messages", "add_generation_prompt", "tokenize", "continue_final_message")
FLAG = "--chat-template-kwargs"


def template_source(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    return template if isinstance(template, str) else json.dumps(template, sort_keys=True)


def template_sha256(tokenizer) -> str:
    return hashlib.sha256(template_source(tokenizer).encode()).hexdigest()


def parse_template_kwargs(text: str | dict | None, flag: str = FLAG) -> dict:
    """--chat-template-kwargs JSON -> a dict (vLLM's name and format, e.g. '{"enable_thinking": false}')."""
    if text is None or text == "":
        return {}
    if isinstance(text, dict):
        value = text
    else:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecdraftError(f"{flag} {text}: not valid JSON ({e.msg} at column {e.colno}); pass an object such "
                                 "as '{\"enable_thinking\": false}'") from None
    if not isinstance(value, dict):
        raise SpecdraftError(f"{flag} {text}: a JSON {type(value).__name__}, not an object; pass an object such as "
                             "'{\"enable_thinking\": false}'")
    own = [k for k in value if k in TEMPLATE_OWN]
    if own:
        raise SpecdraftError(f"{flag}: '{own[0]}' is set by specdraft itself, not a template argument; drop it")
    return value


def check_template_kwargs(tokenizer, kwargs: dict, model: str, flag: str = FLAG) -> None:
    """Each argument must be one the template reads: a typo (enable_thinkng) would be ignored by jinja."""
    source = template_source(tokenizer)
    for key in kwargs:
        if not re.search(rf"\b{re.escape(key)}\b", source):
            raise SpecdraftError(f"{flag}: the chat template of {model} never reads '{key}', so it would change "
                                 "nothing; check the argument's name in the model's chat template, or drop it")


def thinking_style(tokenizer) -> str | None:
    """'harmony' (gpt-oss channels), 'think-tags' (<think>...</think> as single tokens, which the template
    writes) or None (no reasoning format)."""
    vocab = tokenizer.get_vocab()
    if all(t in vocab for t in HARMONY):
        return "harmony"
    if THINK_OPEN in vocab and THINK_CLOSE in vocab and "think>" in template_source(tokenizer):
        return "think-tags"
    return None


def reasoning_field(tokenizer) -> str | None:
    """The assistant-message field the template renders reasoning from (None: it renders none)."""
    source = template_source(tokenizer)
    if "reasoning_content" in source:
        return "reasoning_content"
    if re.search(r"""message\.thinking|message\[['"]thinking['"]\]|['"]thinking['"] in message""", source):
        return "thinking"
    if re.search(r"""message\.reasoning\b|message\[['"]reasoning['"]\]""", source):
        return "reasoning"
    return None


def thinking_mode(tokenizer, kwargs: dict | None = None) -> str:
    """'on' (the target reasons before it answers), 'off' (the generation prompt closes an empty think
    block, e.g. Qwen3's enable_thinking=false, Kimi's thinking=false) or 'none' (no reasoning format)."""
    style = thinking_style(tokenizer)
    if style is None:
        return "none"
    if style == "harmony":                       # gpt-oss reasons at every effort
        return "on"
    probe = [{"role": "user", "content": "2+2?"}]
    prompt, before = (tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=g, **(kwargs or {}))
                      for g in (True, False))
    suffix = prompt[len(before):] if prompt.startswith(before) else prompt
    return "off" if THINK_CLOSE in suffix else "on"
