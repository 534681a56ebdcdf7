"""Long documents made from text that ships on every machine, and long-context prompts over them.

`bench --prompts long` needs prompts of thousands of
tokens without a download: the running interpreter's own standard library (its source with its
docstrings, found through `sysconfig`) and the licence texts beside it (the interpreter's LICENSE.txt,
/usr/share/common-licenses where the system has them). Everything is a pure function of those files,
the requested lengths and the token counter, so the same interpreter gives the same prompts.

A prompt is one of three tasks over a document: summarize it, answer a question about it (a name
it defines), or continue it from where it stops. Lengths are spread geometrically from
MIN_TOKENS up to the bound (the target's context less the answer's room), so every context bucket
of `bench`'s τ-by-context gets prompts.

`prepare --conversations pydoc` reads the same standard library for chat turns whose answers are its
documentation (`pydoc_pairs`): training data that needs no regeneration.
"""

from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from specdraft.errors import SpecdraftError

MIN_TOKENS = 256                 # the shortest document of a spread
PROMPT_ROOM = 96                 # tokens kept for the chat template around the user turn
SKIPPED_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo",
                "__pycache__", "ensurepip", "config-3", "tkinter"}
COMMON_LICENSES = Path("/usr/share/common-licenses")
TASKS = ("summarize", "question", "continue")
LICENCES = "licence texts"


@dataclass
class Document:
    """A long text and where it came from (files, in order)."""
    title: str
    text: str
    sources: list[str]


@lru_cache(maxsize=1)
def stdlib_files() -> list[Path]:
    """The interpreter's standard-library modules (.py, sorted by path), tests and tools left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("config-")]   # pruned, not walked
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    files.sort()
    if not files:
        raise SpecdraftError(f"{root}: no standard-library sources found (sysconfig's stdlib path); "
                             "long prompts are built from them, so run with a full Python install")
    return files


def licence_files() -> list[Path]:
    """The interpreter's LICENSE.txt and the system's common licences (sorted), those that exist."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = [root / "LICENSE.txt"] if (root / "LICENSE.txt").is_file() else []
    if COMMON_LICENSES.is_dir():
        found += sorted(p for p in COMMON_LICENSES.iterdir() if p.is_file())
    return found


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def fit(text: str, tokens: int, count_tokens: Callable[[str], int]) -> str:
    """`text` cut at a line end to at most `tokens` tokens (a few counts, proportional guesses)."""
    for _ in range(6):
        n = count_tokens(text)
        if n <= tokens:
            return text
        cut = int(len(text) * tokens / n * 0.98)
        text = text[:text.rfind("\n", 0, cut) + 1 or cut]
    return text


def build_document(index: int, tokens: int, count_tokens: Callable[[str], int]) -> Document:
    """Document `index` of about `tokens` tokens: every fourth one the licence texts, the rest
    standard-library modules taken in path order from a start that `index` strides through."""
    licences = licence_files()
    if index % 4 == 3 and licences:
        files, title = licences[index // 4 % len(licences):] + licences, LICENCES
    else:
        files, title = bench_files(index), "Python standard library source"
    parts, used = concatenated(files, tokens * 6)          # characters: more than enough before the exact cut
    text = fit("\n".join(parts), tokens, count_tokens)
    return Document(title, text, used[:text.count("# file: ")] or used[:1])


def bench_files(index: int) -> list[Path]:
    """The standard-library files in the order document `index` of the long set reads them."""
    files = stdlib_files()
    start = (index * 37) % len(files)
    return files[start:] + files[:start]


def concatenated(files: list[Path], chars: int) -> tuple[list[str], list[str]]:
    """The files' texts, each under a `# file:` line, in order until they reach `chars` characters
    -> (texts, their paths)."""
    parts, used, total = [], [], 0
    for path in files:
        body = read(path).strip()
        if not body:
            continue
        parts.append(f"# file: {path.name}\n{body}\n")
        used.append(str(path))
        total += len(parts[-1])
        if total >= chars:
            break
    return parts, used


def defined_name(text: str) -> str | None:
    """A function or class the document defines (the first), for the question task."""
    found = re.search(r"^(?:def|class) ([A-Za-z_][A-Za-z0-9_]*)", text, re.MULTILINE)
    return found.group(1) if found else None


def task_prompt(task: str, doc: Document) -> str:
    """The user turn: the task's words around the document."""
    if task == "summarize":
        return f"Summarize the following {doc.title} in a few paragraphs.\n\n{doc.text}"
    if task == "question":
        name = defined_name(doc.text)
        ask = (f"What does `{name}` do, and how is it used in the code above?" if name else
               "What does the text above allow, and what does it require in return?" if doc.title == LICENCES else
               "What is the code above for, and what does it import?")
        return f"Read the following {doc.title}, then answer the question after it.\n\n{doc.text}\n\nQuestion: {ask}"
    return f"Continue the following {doc.title} from where it stops.\n\n{doc.text}"


def spread(count: int, high: int, low: int = MIN_TOKENS) -> list[int]:
    """`count` document lengths from `low` to `high` tokens, evenly on a log scale."""
    if high < low:
        raise SpecdraftError(f"--max-context: leaves {high} tokens for a document; long prompts need at least "
                             f"{low} (raise --max-context, or lower --max-new-tokens)")
    if count == 1:
        return [high]
    return [round(low * (high / low) ** (i / (count - 1))) for i in range(count)]


def long_prompts(count: int, max_tokens: int, count_tokens: Callable[[str], int]) -> list[list[dict]]:
    """`count` long-context conversations (a user turn each) whose lengths spread up to `max_tokens`
    less PROMPT_ROOM (the chat template's), the tasks in turn (summarize, question, continue); each
    document is cut to what its task's words leave."""
    convs = []
    for i, n in enumerate(spread(count, max_tokens - PROMPT_ROOM)):
        task = TASKS[i % len(TASKS)]
        words = count_tokens(task_prompt(task, Document("Python standard library source", "def " + "x" * 24, [])))
        doc = build_document(i, max(n - words, 1), count_tokens)
        convs.append([{"role": "user", "content": task_prompt(task, doc)}])
    return convs


# --- `prepare --conversations long`: long documents to train on, none that bench's long set reads ----------------

LONG_ANSWER_TOKENS = 256         # a long conversation's answer: the next text of its document
BENCH_DOCUMENTS = 64             # the long set's first 64 documents at 8K tokens ...
BENCH_CHARS = 8192 * 6           # ... read these files at most: training leaves them out


def training_files() -> list[Path]:
    """The standard-library files no document of bench's long set reads (its first BENCH_DOCUMENTS,
    at up to BENCH_CHARS characters each), licence texts left out too: what `long` trains on stays
    apart from what `bench --prompts long` measures."""
    read_by_bench = {path for index in range(BENCH_DOCUMENTS)
                     for path in concatenated(bench_files(index), BENCH_CHARS)[1]}
    return [f for f in stdlib_files() if str(f) not in read_by_bench]


def long_conversations(count: int, max_tokens: int, count_tokens: Callable[[str], int]) -> list[list[dict]]:
    """`count` conversations over long documents (`prepare --conversations long`): the user asks to
    continue a run of standard-library source (training_files), the answer is what follows it
    (LONG_ANSWER_TOKENS). Document lengths spread on a log scale up to what `max_tokens` leaves after
    the answer and the chat template, so training positions reach the longest context."""
    files = training_files()
    high = max_tokens - LONG_ANSWER_TOKENS - PROMPT_ROOM
    convs = []
    for i, n in enumerate(spread(count, high, low=min(MIN_TOKENS * 2, high))):
        start = (i * 53) % len(files)
        parts, _ = concatenated(files[start:] + files[:start], (n + LONG_ANSWER_TOKENS) * 6)
        text = fit("\n".join(parts), n + LONG_ANSWER_TOKENS, count_tokens)
        head = fit(text, n, count_tokens)
        doc = Document("Python standard library source", head, [])
        convs.append([{"role": "user", "content": task_prompt("continue", doc)},
                      {"role": "assistant", "content": fit(text[len(head):], LONG_ANSWER_TOKENS, count_tokens)}])
    return convs


# --- `prepare --conversations pydoc`: chat answers that are Python's own documentation ----------------------------

PYDOC_ANSWER_CHARS = 2400        # about 600 tokens: one answer's length at most


@lru_cache(maxsize=1)   # ~3.6 s of parsing the standard library: once per process
def pydoc_pairs() -> tuple[tuple[str, str], ...]:
    """(question, answer) pairs whose answers are the interpreter's documentation, no import of
    what they document: the language reference's topics (pydoc_data) and the docstrings of the
    standard library's modules, classes and functions, read with `ast` (only those over 300
    characters: a sentence or two teaches little). Sorted, so the same interpreter gives the same list."""
    import ast

    from pydoc_data.topics import topics

    pairs = [(f"Explain the Python topic '{name}'.", text.strip()) for name, text in sorted(topics.items())]
    for path in stdlib_files():
        try:
            tree = ast.parse(read(path))
        except (SyntaxError, ValueError):
            continue
        module = path.stem if path.stem != "__init__" else path.parent.name
        doc = ast.get_docstring(tree)
        if doc and len(doc) > 200:
            pairs.append((f"What is the Python module `{module}` for?", doc))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 300:
                    pairs.append((f"What does `{module}.{node.name}` do?", doc))
    return tuple((q, a[:PYDOC_ANSWER_CHARS]) for q, a in pairs)


def pydoc_conversations(seed: int, limit: int | None, answers: bool) -> list[list[dict]]:
    """`limit` of pydoc_pairs in --seed's order as chat turns; answers=False keeps the questions only
    (--regenerate: the target answers them)."""
    import random

    pairs = list(pydoc_pairs())
    random.Random(seed).shuffle(pairs)
    return [[{"role": "user", "content": q}] + ([{"role": "assistant", "content": a}] if answers else [])
            for q, a in pairs[:limit]]
