"""The target's chat format, as every stage uses it: prompts rendered with the chat template and its
arguments (vLLM's `chat_template_kwargs`, e.g. {"enable_thinking": false}), answers taken as the
token ids the target generated, and training samples with their loss mask (1 on exactly the tokens
the target itself generates in an assistant turn, its end-of-turn token included).

An assistant turn is split into its prompt (the conversation before it, rendered with the
generation prompt: what the model saw) and its answer:
- an answer the target generated (regeneration) keeps its ids (`token_ids` on the message), never
  decoded and rendered again, so reasoning, channels and special tokens are trained as generated;
- an answer given as text is the template's own rendering of the turn beyond its prompt.
Turns whose prompt continues the previous turn's prompt + answer token for token share one sample.
Templates that drop earlier turns' reasoning (Qwen3, Kimi, gpt-oss) break that chain; those
conversations give one sample per assistant turn, each as the model saw it.

Reasoning: messages carry it as `reasoning_content` (vLLM's and OpenAI-style exports' field); it
is handed to the template under the field the template reads (`reasoning_content`, or
`thinking` for harmony-style templates). Generated answers are split into reasoning and content
by the template's style: think tags (<think>...</think>) or harmony channels (analysis, final).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from specdraft.errors import SpecdraftError
from specdraft.templates import FLAG, HARMONY, THINK_CLOSE, THINK_OPEN, reasoning_field, thinking_mode, thinking_style

# End-of-turn markers of common templates; used only when the tokenizer has them as one token.
KNOWN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_turn|>",
                    "<|eot|>", "<|endoftext|>", "<|end_of_text|>", "</s>")
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")   # what input records may name it


@dataclass
class Rendered:
    input_ids: list[int]
    loss_mask: list[int]    # same length as input_ids; 1 on assistant tokens
    turn: int = 0           # index of the first trained assistant message
    messages: list[dict] = field(default_factory=list)   # the conversation this sample holds

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class Answer:
    """One generated answer: the assistant message (content, reasoning_content, token_ids kept up to
    and with its end-of-turn id), whether --max-new-tokens cut it, and its new-token count."""
    message: dict
    truncated: bool
    new_tokens: int


def require_chat_template(tokenizer, model: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise SpecdraftError(f"--model {model}: the tokenizer has no chat template; pass a model with a chat "
                             "template (an instruct/chat model)")


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


def encode(tokenizer, text: str) -> list[int]:
    """Template text already holds its special tokens (BOS included): add none."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass
class Chat:
    """The target's chat format: its tokenizer, the template arguments and the end-of-turn ids."""
    tokenizer: Any
    end_ids: list[int]
    kwargs: dict = field(default_factory=dict)

    @cached_property
    def style(self) -> str | None:
        return thinking_style(self.tokenizer)

    @cached_property
    def reasoning_key(self) -> str | None:
        return reasoning_field(self.tokenizer)

    @cached_property
    def vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    # ------------------------------------------------------------------ rendering

    def for_template(self, messages: list[dict]) -> list[dict]:
        """Messages as the template takes them: no token ids, reasoning under the template's field."""
        out = []
        for m in messages:
            shown = {k: v for k, v in m.items() if k not in ("token_ids", "reasoning_content")}
            if m.get("reasoning_content") and self.reasoning_key:
                shown[self.reasoning_key] = m["reasoning_content"]
            out.append(shown)
        return out

    def text(self, messages: list[dict], add_generation_prompt: bool, where: str = "") -> str:
        try:
            return self.tokenizer.apply_chat_template(self.for_template(messages), tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **self.kwargs)
        except Exception as e:  # jinja raises template-defined errors, e.g. "roles must alternate"
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SpecdraftError(f"{where or 'conversation'}: the chat template cannot render it ({msg})") from None

    def prompt_ids(self, messages: list[dict], where: str = "") -> list[int]:
        """The conversation so far with the generation prompt: what the target answers from."""
        return encode(self.tokenizer, self.text(messages, True, where))

    def mode(self) -> str:
        """'on', 'off' or 'none' (templates.thinking_mode) with these template arguments."""
        return thinking_mode(self.tokenizer, self.kwargs)

    # ------------------------------------------------------------------ answers

    def answer(self, prompt_ids: list[int], ids: list[int], hit_length: bool) -> Answer:
        """The generated ids of one answer, whatever engine made them: kept through the first end-of-turn
        id (engines may or may not return it), split into reasoning and content for later turns' prompts."""
        stop = first_end(ids, self.end_ids)
        kept = list(ids) if stop is None else list(ids[:stop + 1])
        body = kept if stop is None else kept[:-1]
        reasoning, content = self.parse(prompt_ids, body)
        message = {"role": "assistant", "content": content, **({"reasoning_content": reasoning} if reasoning else {}),
                   "token_ids": kept}
        return Answer(message, truncated=stop is None and hit_length, new_tokens=len(kept))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def reasoning_length(self, prompt_ids: list[int], ids: list[int]) -> int:
        """How many of the generated `ids` (from their start) are reasoning: through </think>, or up to
        the harmony message that is not analysis; 0 for a template without reasoning."""
        return self.split(prompt_ids, ids)[0]

    def parse(self, prompt_ids: list[int], body: list[int]) -> tuple[str, str]:
        """(reasoning, content) texts of an answer's ids (without its end-of-turn id)."""
        _, reasoning_ids, content_ids = self.split(prompt_ids, body)
        return self.decode(reasoning_ids), self.decode(content_ids)

    def split(self, prompt_ids: list[int], body: list[int]) -> tuple[int, list[int], list[int]]:
        """(reasoning length, reasoning ids, content ids) of an answer's ids."""
        if self.style == "think-tags":
            return self.split_think(prompt_ids, body)
        if self.style == "harmony":
            return self.split_harmony(body)
        return 0, [], list(body)

    def split_think(self, prompt_ids: list[int], body: list[int]) -> tuple[int, list[int], list[int]]:
        open_id, close_id = self.vocab[THINK_OPEN], self.vocab[THINK_CLOSE]
        last = {t: max((i for i, x in enumerate(prompt_ids) if x == t), default=-1) for t in (open_id, close_id)}
        opened = last[open_id] > last[close_id]          # the generation prompt ends inside a think block
        starts = bool(body) and body[0] == open_id
        if close_id in body:
            end = body.index(close_id)
            return end + 1, body[int(starts):end], body[end + 1:]
        if opened or starts:                              # reasoning cut by --max-new-tokens
            return len(body), body[int(starts):], []
        return 0, [], list(body)

    def split_harmony(self, body: list[int]) -> tuple[int, list[int], list[int]]:
        """Messages `<|channel|>NAME<|message|>TEXT` separated by <|end|><|start|>assistant: analysis is
        reasoning, any other channel content. Ids outside that shape are content."""
        start, channel, message, end = (self.vocab[t] for t in HARMONY)
        if channel not in body:
            return 0, [], list(body)
        reasoning, content, length, i = [], [], None, 0
        while channel in body[i:]:
            c = body.index(channel, i)
            m = body.index(message, c) if message in body[c:] else len(body)
            i = next((j for j in range(m + 1, len(body)) if body[j] in (end, start, channel)), len(body))
            if self.decode(body[c + 1:m]).split(" ")[0] == "analysis":
                reasoning += body[m + 1:i]
                continue
            if length is None:                           # the reasoning part ends where this message opens
                length = max((j + 1 for j in range(c) if body[j] == end), default=0)
            content += body[m + 1:i]
        return (len(body) if length is None else length), reasoning, content

    # ------------------------------------------------------------------ samples

    def render(self, messages: list[dict], where: str = "") -> list[Rendered]:
        """The training samples of one conversation: its assistant turns (but a leading one, which has
        no prompt and stays context) as prompt + answer, in one sample where each turn's prompt
        continues the one before it token for token, else one sample per turn."""
        turns = []                                   # (message index, prompt ids, answer ids)
        for i, m in enumerate(messages):
            if m["role"] != "assistant" or i == 0:
                continue
            prompt_text = self.text(messages[:i], True, where)
            prompt = encode(self.tokenizer, prompt_text)
            if m.get("token_ids") is not None:
                turns.append((i, prompt, [int(t) for t in m["token_ids"]]))
            else:
                turns.append((i, *self.written_turn(messages, i, prompt_text, prompt, where)))
        if not turns:                                # prompts only: nothing to train (counted by prepare)
            ids = encode(self.tokenizer, self.text(messages, False, where))
            return [Rendered(ids, [0] * len(ids), 0, list(messages))]
        chained = all(b[:len(p) + len(a)] == p + a for (_, p, a), (_, b, _) in zip(turns, turns[1:]))
        if not chained:
            return [Rendered(p + a, [0] * len(p) + [1] * len(a), i, list(messages[:i + 1])) for i, p, a in turns]
        _, prompt, answer = turns[-1]
        ids = prompt + answer
        mask = [0] * len(ids)
        for _, p, a in turns:
            mask[len(p):len(p) + len(a)] = [1] * len(a)
        return [Rendered(ids, mask, turns[0][0], list(messages[:turns[-1][0] + 1]))]

    def written_turn(self, messages: list[dict], i: int, prompt_text: str, prompt_ids: list[int],
                     where: str) -> tuple[list[int], list[int]]:
        """(prompt ids, answer ids) of assistant turn i given as text: the template's rendering of the
        turn beyond its generation prompt (`prompt_text`, tokenized `prompt_ids`), through its last
        end-of-turn token (template whitespace after it, like the "\\n" after <|im_end|>, is never generated)."""
        turn_text = self.text(messages[:i + 1], False, where)
        if not turn_text.startswith(prompt_text):
            raise SpecdraftError(f"{where or 'conversation'}: the chat template renders assistant turn {i} so that it "
                                 "does not continue its own generation prompt, so its tokens cannot be located "
                                 f"(e.g. reasoning in a turn that {FLAG} asks to answer without thinking); fix the "
                                 "turn or the template arguments")
        turn_ids = encode(self.tokenizer, turn_text)
        # The first content token may merge with the end of the generation prompt (e.g. "\n" +
        # "\n\nHi" -> "\n\n\n"): start at the last token the two tokenizations share.
        start = common_prefix_length(prompt_ids, turn_ids)
        ends = set(self.end_ids)
        end = next((j + 1 for j in range(len(turn_ids) - 1, start - 1, -1) if turn_ids[j] in ends), len(turn_ids))
        return turn_ids[:start], turn_ids[start:end]


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def first_end(ids: list[int], end_ids) -> int | None:
    """Index of the first end-of-turn id in generated `ids` (engines may or may not return it), None if none."""
    ends = set(end_ids)
    return next((i for i, t in enumerate(ids) if t in ends), None)


def decode_question(tok, ids: list[int], hit_length: bool, end_ids: list[int]) -> tuple[str, bool]:
    """(text, cut by the length limit) of a question the target wrote: text up to its first end id."""
    stop = first_end(ids, end_ids)
    return tok.decode(ids if stop is None else ids[:stop], skip_special_tokens=True).strip(), stop is None and hit_length
