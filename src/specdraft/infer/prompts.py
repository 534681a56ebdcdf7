"""The prompts bench and generate run: the prompt sets (builtin-holdout, natural, a jsonl file, long) and a
conversation rendered to token ids.

A prompt set is read into conversations (read_prompts; read_prompt_rows keeps each line's category); `long` is built
for the target's tokenizer and context (long_prompt_set). prompt_ids renders one through the chat template with
--chat-template-kwargs, target_chat gives the target's chat format with them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdraft.data.builtin_prompts import builtin_prompts
from specdraft.data.render import Chat, end_of_turn_ids
from specdraft.errors import SpecdraftError
from specdraft.templates import check_template_kwargs

NATURAL = "natural"
NATURAL_FILE = Path(__file__).resolve().parent.parent / "data" / "natural.jsonl"
PROMPT_SETS = ("builtin-holdout", NATURAL)
LONG = "long"          # bench only: built for the target's tokenizer and context (data/documents.py)
LONG_PROMPTS = 8       # its size without --limit


def long_prompt_set(target, limit: int | None, max_context: int | None, max_new_tokens: int,
                    rows: int) -> list[list[dict]]:
    """`--prompts long`: conversations over long documents (data/documents.py) whose prompts spread up
    to the target's context (or --max-context, at most that) less the answer and a round's rows."""
    from specdraft.data.documents import long_prompts

    context = getattr(target.model.config, "max_position_embeddings", None) or max_context or 2048
    if max_context is not None and max_context > context:
        raise SpecdraftError(f"--max-context {max_context}: {target.name} attends over {context} tokens at most; "
                             f"pass --max-context {context} or less")
    tok = target.tokenizer

    def count_tokens(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return long_prompts(limit or LONG_PROMPTS, (max_context or context) - max_new_tokens - rows, count_tokens)


def prompt_set_path(source: str) -> Path:
    """--prompts NAME: `natural` is the hand-written set shipped with specdraft; anything else a file."""
    return NATURAL_FILE if source == NATURAL else Path(source)


@dataclass
class PromptRow:
    """One prompt of a prompt set: the messages to prompt with and the line's `category` (if any)."""
    messages: list[dict]
    category: str | None = None


def read_prompts(source: str, limit: int | None = None) -> list[list[dict]]:
    """`builtin-holdout`, `natural` (hand-written prompts shipped in data/natural.jsonl), or a jsonl
    file of {"messages": [...]} (or {"prompt": "..."}): the prompt is every message up to and
    including the last user turn (system, user and earlier assistant turns as context), so a
    multi-turn line benches its last user turn."""
    return [row.messages for row in read_prompt_rows(source, limit)]


def read_prompt_rows(source: str, limit: int | None = None) -> list[PromptRow]:
    """read_prompts with each line's optional `category` (natural.jsonl: writing, coding, ...)."""
    if source == LONG:
        raise SpecdraftError("--prompts long: the long-context set is built for a target's tokenizer and context; "
                             "run it with `specdraft bench --prompts long`")
    if source == "builtin-holdout":
        rows = [PromptRow([{"role": "user", "content": p}]) for p in builtin_prompts(limit or 32, split="holdout")]
    else:
        path = prompt_set_path(source)
        if path.is_dir():
            raise SpecdraftError(f"--prompts {source}: is a directory; pass a jsonl file or builtin-holdout")
        if not path.is_file():
            raise SpecdraftError(f"--prompts {source}: file not found; pass a jsonl file or builtin-holdout")
        rows = []
        for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SpecdraftError(f"{path}:{n}: not UTF-8 (byte {e.start}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpecdraftError(f"{path}:{n}: not valid JSON ({e.msg}); one object per line") from None
            category = row.get("category") if isinstance(row, dict) else None
            if category is not None and not (isinstance(category, str) and category.strip()):
                raise SpecdraftError(f"{path}:{n}: category is {json.dumps(category)[:40]}, not a name; "
                                     'give a name such as "coding" or drop the field')
            if isinstance(row, dict) and isinstance(row.get("prompt"), str):
                rows.append(PromptRow([{"role": "user", "content": row["prompt"]}], category))
                continue
            messages = row.get("messages") if isinstance(row, dict) else None
            if not isinstance(messages, list):
                raise SpecdraftError(f"{path}:{n}: no `messages` list; expected "
                                     '{"messages": [{"role": "user", "content": ...}]}')
            turns = prompt_turns(messages, f"{path}:{n}")
            if turns:
                rows.append(PromptRow(turns, category))
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise SpecdraftError(f"--prompts {source}: no prompts (no line with a user turn); add some or use builtin-holdout")
    return rows


def prompt_turns(messages: list, where: str) -> list[dict]:
    """Every message up to and including the last user turn ([] without one): the answers before
    it are context, an answer after it (the reply a dataset line may carry) is not prompted."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise SpecdraftError(f"{where}: message {i} is {json.dumps(m)[:40]}, not an object; "
                                 'write it as {"role": ..., "content": ...}')
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    turns = []
    for m in messages[:users[-1] + 1] if users else []:
        if not isinstance(m.get("content"), str):   # str(None) was prompted as the text "None"
            raise SpecdraftError(f"{where}: {m.get('role')} content is "
                                 f"{json.dumps(m.get('content'))[:40]}, not a string; give the turn its text")
        turns.append({"role": m.get("role"), "content": m["content"]})
    return turns


def prompt_ids(tokenizer, messages: list[dict], template_kwargs: dict | None = None) -> list[int]:
    """Chat template (with its arguments, --chat-template-kwargs) and the generation prompt; plain text
    when the tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None):
        return Chat(tokenizer, [], template_kwargs or {}).prompt_ids(messages)
    return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]


def target_chat(target, kwargs: dict) -> Chat:
    """The target's chat format with --chat-template-kwargs (checked: each one its template reads)."""
    from specdraft.adapter import architecture

    tok = target.tokenizer
    if kwargs and not getattr(tok, "chat_template", None):
        raise SpecdraftError(f"--chat-template-kwargs: {target.name} has no chat template to take them; drop them")
    check_template_kwargs(tok, kwargs, target.name)
    ends = end_of_turn_ids(tok, getattr(target.model, "generation_config", None), architecture(target.config).end_tokens)
    return Chat(tok, ends, kwargs)
