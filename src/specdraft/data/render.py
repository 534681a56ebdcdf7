"""Render a conversation with the target's chat template and build the loss mask: 1 on exactly
the tokens the target itself would generate in each assistant turn (the content and the
turn's end token such as <|im_end|>), 0 on everything else (system/user turns, role headers,
template whitespace).

Turn boundaries come from the template itself, not from hard-coded markers: the tokens of
assistant turn i are what `messages[:i+1]` renders beyond `messages[:i]` + generation prompt.
This works for any template that renders earlier turns unchanged ("prefix-stable"); one that
does not (e.g. one that rewrites earlier turns) is refused with a clear message.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from specdraft.errors import SpecdraftError

# End-of-turn markers of common templates; used only when the tokenizer has them as one token.
KNOWN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_turn|>",
                    "<|eot|>", "<|endoftext|>", "<|end_of_text|>", "</s>")


@dataclass
class Rendered:
    input_ids: list[int]
    loss_mask: list[int]    # same length as input_ids; 1 on assistant tokens

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def require_chat_template(tokenizer, model: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise SpecdraftError(f"--model {model}: the tokenizer has no chat template; pass a model with a chat "
                             "template (an instruct/chat model)")


def template_sha256(tokenizer) -> str:
    template = tokenizer.chat_template
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def end_of_turn_ids(tokenizer, generation_config=None, end_tokens: tuple[str, ...] = ()) -> list[int]:
    """Token ids that end an assistant turn: eos of the tokenizer and of the generation config, plus
    the architecture's own end tokens where the target adapter names them (gpt-oss's harmony: <|return|>
    and <|call|>, never <|end|>, which ends its analysis message inside one answer), else the usual
    end-of-turn markers when they are single tokens of this vocab."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(generation_config, "eos_token_id", None)
    if gen_eos is not None:
        ids.update(int(i) for i in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]))
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in (end_tokens or KNOWN_END_TOKENS) if t in vocab)
    return sorted(ids)


def render_text(tokenizer, messages: list[dict], add_generation_prompt: bool, where: str = "") -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as e:  # jinja raises template-defined errors, e.g. "roles must alternate"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecdraftError(f"{where or 'conversation'}: the chat template cannot render it ({msg})") from None


def encode(tokenizer, text: str) -> list[int]:
    """Template text already holds its special tokens (BOS included): add none."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render(tokenizer, messages: list[dict], end_ids: list[int] | set[int], where: str = "") -> Rendered:
    """Token ids of the whole conversation and the assistant-token loss mask."""
    full_text = render_text(tokenizer, messages, False, where)
    input_ids = encode(tokenizer, full_text)
    loss_mask = [0] * len(input_ids)
    end_ids = set(end_ids)
    for i, message in enumerate(messages):
        # A conversation that opens with an assistant turn has no prompt for it: keep it as context.
        if message["role"] != "assistant" or i == 0:
            continue
        prompt_text = render_text(tokenizer, messages[:i], True, where)
        turn_text = render_text(tokenizer, messages[:i + 1], False, where)
        if not (turn_text.startswith(prompt_text) and full_text.startswith(turn_text)):
            raise not_prefix_stable(where, i)
        prompt_ids = encode(tokenizer, prompt_text)
        turn_ids = encode(tokenizer, turn_text)
        if input_ids[:len(turn_ids)] != turn_ids:
            raise not_prefix_stable(where, i)
        # The first content token may merge with the end of the generation prompt (e.g. "\n" +
        # "\n\nHi" -> "\n\n\n"): start at the last token the two tokenizations share.
        start = common_prefix_length(prompt_ids, input_ids)
        end = len(turn_ids)
        # The turn ends at its last end-of-turn token; template whitespace after it
        # (the "\n" after <|im_end|>) is never generated, so it is not trained.
        for j in range(end - 1, start - 1, -1):
            if input_ids[j] in end_ids:
                end = j + 1
                break
        for j in range(start, end):
            loss_mask[j] = 1
    return Rendered(input_ids=input_ids, loss_mask=loss_mask)


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def not_prefix_stable(where: str, turn: int) -> SpecdraftError:
    return SpecdraftError(f"{where or 'conversation'}: the chat template is not prefix-stable (rendering the "
                          f"conversation up to turn {turn} is not a prefix of the whole rendering), so assistant "
                          "tokens cannot be located; use a model whose template renders earlier turns unchanged")


def answer_from_ids(tok, ids: list[int], hit_length: bool, end_ids: list[int]) -> tuple[str, bool, int]:
    """(text, truncated, new tokens) from one answer's generated ids, whatever engine made them:
    cut at the first end-of-turn id (engines may or may not return it), decode without specials."""
    ends = set(end_ids)
    stop = next((i for i, t in enumerate(ids) if t in ends), None)
    content = ids if stop is None else ids[:stop]
    truncated = stop is None and hit_length
    text = tok.decode(content, skip_special_tokens=True).strip()
    return text, truncated, len(content) + (0 if truncated else 1)
