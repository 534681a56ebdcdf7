"""Read conversations from a file (jsonl/json/parquet), a Hugging Face dataset id or the
builtin prompts, and normalise them to lists of {"role", "content"} messages (assistant turns with
their reasoning as `reasoning_content` where the record carries it).

Every problem in the input becomes a SpecdraftError that names the file and the line or
record, so the user can find and fix it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from specdraft.data.builtin_prompts import builtin_prompts
from specdraft.data.render import REASONING_FIELDS
from specdraft.errors import SpecdraftError

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
# ShareGPT speakers and common aliases -> chat-template roles.
ROLE_ALIASES = {
    "system": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "model": "assistant", "chatgpt": "assistant",
}


@dataclass
class Conversation:
    messages: list[dict]   # [{"role": "system"|"user"|"assistant", "content": str}, ...]
    where: str             # "file.jsonl line 7" / "org/ds record 12": for error messages


def source_kind(source: str) -> str:
    """'builtin', 'self' (the target writes the questions), 'pydoc' (Python's documentation as answers),
    'long' (long documents continued, data/documents.py), 'file' or 'hub' (a dataset id such as org/name)."""
    if source in ("builtin", "pydoc", "long"):
        return source
    if source == "self" or source.startswith("self:"):
        return "self"
    path = Path(source)
    if path.exists() or path.suffix in FILE_SUFFIXES or source.startswith((".", "/", "~")):
        return "file"
    return "hub"


def self_question_count(source: str) -> int | None:
    """'self' or 'self:N' -> N, the questions the target writes (None: as many as --limit asks)."""
    if source == "self":
        return None
    count = source.removeprefix("self:")
    if not count.isdigit() or int(count) < 1:
        raise SpecdraftError(f"--conversations {source}: use self or self:N (N >= 1 questions the target writes)")
    return int(count)


def read_records(source: str, split: str = "train") -> Iterator[tuple[Any, str]]:
    """Yield (raw record, where) from a local file or a hub dataset."""
    kind = source_kind(source)
    if kind == "file":
        yield from read_file(Path(source).expanduser())
    elif kind == "hub":
        yield from read_hub(source, split)
    else:
        raise SpecdraftError("--conversations builtin: builtin prompts are read with builtin_conversations()")


def read_file(path: Path) -> Iterator[tuple[Any, str]]:
    if not path.exists():
        raise SpecdraftError(f"{path}: data file not found; pass a .jsonl/.json/.parquet file, "
                             "a Hugging Face dataset id or 'builtin'")
    if path.is_dir():
        raise SpecdraftError(f"{path}: is a directory; pass a .jsonl/.json/.parquet file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from read_jsonl(path)
    elif suffix == ".json":
        yield from read_json_file(path)
    elif suffix == ".parquet":
        yield from read_parquet(path)
    else:
        raise SpecdraftError(f"{path}: unknown file type '{path.suffix}'; use .jsonl, .json or .parquet")


def read_jsonl(path: Path) -> Iterator[tuple[Any, str]]:
    """One JSON record per line; blank lines are skipped."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SpecdraftError(f"{path} line {number}: not UTF-8 (byte {e.start + 1} of the line); "
                                     "re-encode the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpecdraftError(f"{path} line {number}: not valid JSON ({e.msg} at column {e.colno}); "
                                     "fix or remove the line") from None
            yield record, f"{path} line {number}"


def read_json_file(path: Path) -> Iterator[tuple[Any, str]]:
    """A JSON list of records (or an object holding one such list, e.g. {"data": [...]})."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise SpecdraftError(f"{path} line {line}: not UTF-8; re-encode the file as UTF-8") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecdraftError(f"{path} line {e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    if isinstance(obj, dict):
        lists = [v for v in obj.values() if isinstance(v, list)]
        if "messages" in obj or "conversations" in obj or len(lists) != 1:
            obj = [obj]
        else:
            obj = lists[0]
    if not isinstance(obj, list):
        raise SpecdraftError(f"{path}: expected a JSON list of conversation records")
    for i, record in enumerate(obj):
        yield record, f"{path} record {i}"


def read_parquet(path: Path) -> Iterator[tuple[Any, str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise SpecdraftError(f"{path}: unreadable parquet file ({str(e).splitlines()[0]})") from None
    for i, record in enumerate(table.to_pylist()):
        yield record, f"{path} record {i}"


def read_hub(dataset_id: str, split: str) -> Iterator[tuple[Any, str]]:
    import datasets

    try:
        ds = datasets.load_dataset(dataset_id, split=split)
    except Exception as e:  # network, missing dataset, missing split: all one line for the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecdraftError(f"--conversations {dataset_id}: cannot load Hugging Face dataset split '{split}' "
                             f"({first}); check the id, --split and your network") from None
    for i, record in enumerate(ds):
        yield record, f"{dataset_id} record {i}"


def normalize(record: Any, where: str, allow_empty_assistant: bool = False) -> Conversation:
    """`messages` (role/content) or ShareGPT `conversations` (from/value) -> Conversation."""
    if not isinstance(record, dict):
        raise SpecdraftError(f"{where}: expected an object with a 'messages' or 'conversations' field, "
                             f"got {type(record).__name__}")
    if "messages" in record:
        turns, role_key, content_key = record["messages"], "role", "content"
    elif "conversations" in record:
        turns, role_key, content_key = record["conversations"], "from", "value"
    else:
        fields = ", ".join(sorted(map(str, record))) or "none"
        raise SpecdraftError(f"{where}: no 'messages' or 'conversations' field (fields: {fields}); "
                             "each record needs a list of {role, content} or {from, value} turns")
    if not isinstance(turns, list) or not turns:
        raise SpecdraftError(f"{where}: the conversation must be a non-empty list of turns")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise SpecdraftError(f"{where} turn {i}: expected an object, got {type(turn).__name__}")
        # ShareGPT dumps sometimes use role/content inside `conversations`, and vice versa.
        raw_role = turn.get(role_key, turn.get("role", turn.get("from")))
        content = turn.get(content_key, turn.get("content", turn.get("value")))
        role = ROLE_ALIASES.get(str(raw_role).lower()) if raw_role is not None else None
        if role is None:
            raise SpecdraftError(f"{where} turn {i}: unknown role {raw_role!r}; use system/user/assistant "
                                 "(or ShareGPT system/human/gpt)")
        if content is None and role != "assistant":   # a null answer is for --regenerate to write; a null question is bad
            raise SpecdraftError(f"{where} turn {i}: {role} content is null; give the turn its text (a string) "
                                 "or drop the record")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise SpecdraftError(f"{where} turn {i}: content must be a string, got {type(content).__name__}")
        reasoning = turn_reasoning(turn, role, f"{where} turn {i}")
        if role == "assistant" and not content.strip() and not reasoning and not allow_empty_assistant:
            raise SpecdraftError(f"{where} turn {i}: empty assistant turn; fix the record, drop it, "
                                 "or pass --regenerate to let the target write the answers")
        messages.append({"role": role, "content": content, **({"reasoning_content": reasoning} if reasoning else {})})
    return Conversation(messages=messages, where=where)


def turn_reasoning(turn: dict, role: str, where: str) -> str:
    """An assistant turn's reasoning as vLLM and OpenAI-style exports carry it (`reasoning_content`, or
    `reasoning`; `thinking` as harmony templates name it), kept to be rendered the way the template
    renders reasoning; '' where there is none."""
    name = next((f for f in REASONING_FIELDS if turn.get(f) not in (None, "")), None)
    if name is None:
        return ""
    if role != "assistant":
        raise SpecdraftError(f"{where}: a {role} turn with '{name}'; only assistant turns carry reasoning; "
                             "move it or drop the field")
    if not isinstance(turn[name], str):
        raise SpecdraftError(f"{where}: '{name}' must be a string, got {type(turn[name]).__name__}")
    return turn[name]


def load_conversations(source: str, split: str = "train", seed: int = 0, limit: int | None = None,
                       regenerate: bool = False) -> Iterator[Conversation]:
    """All conversations of --conversations, normalised. Builtin prompts need --regenerate."""
    if source == "builtin":
        if not regenerate:
            raise SpecdraftError("--conversations builtin: builtin samples are prompts without answers; "
                                 "pass --regenerate so the target writes them")

        for i, prompt in enumerate(builtin_prompts(limit, seed=seed, split="train")):
            yield Conversation(messages=[{"role": "user", "content": prompt}], where=f"builtin prompt {i}")
        return
    if source == "pydoc":                # answers as written: the teacher is the target at every position anyway
        from specdraft.data.documents import pydoc_conversations

        for i, messages in enumerate(pydoc_conversations(seed, limit, answers=not regenerate)):
            yield Conversation(messages=messages, where=f"pydoc conversation {i}")
        return
    if source == "long":
        raise SpecdraftError("--conversations long: long documents are cut with the target's tokenizer to "
                             "--max-length, so they are not a mixture's part; prepare them on their own "
                             "(--conversations long --limit N --max-length 8192)")
    if source_kind(source) == "self":   # written by the target once it is loaded (data/self_prompts.py)
        if not regenerate:
            raise SpecdraftError(f"--conversations {source}: the target writes these questions; pass --regenerate "
                                 "so it answers them too")
        return
    for record, where in read_records(source, split):
        yield normalize(record, where, allow_empty_assistant=regenerate)
