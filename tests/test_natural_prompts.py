"""The hand-written natural prompt set (data/natural.jsonl, `--prompts natural`) and how prompt
files are read: 96 prompts, 8 categories x 12, multi-turn lines bench their last user turn."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import read_configuration

from specdraft.data.builtin_prompts import builtin_prompts
from specdraft.errors import SpecdraftError
from specdraft.infer.prompts import NATURAL_FILE, read_prompt_rows, read_prompts

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "STEM", "humanities"}


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def ngrams(text: str, n: int = 8) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def test_natural_set_is_96_prompts_in_8_categories_of_12():
    rows = read_prompt_rows("natural")
    assert len(rows) == 96 and len(read_prompts("natural")) == 96
    assert Counter(r.category for r in rows) == {c: 12 for c in CATEGORIES}
    assert all(r.messages[-1]["role"] == "user" for r in rows)
    multi = [r for r in rows if any(m["role"] == "assistant" for m in r.messages)]
    assert len(multi) >= 16
    for r in multi:   # user, assistant, user: the bench prompt is the second user turn with its context
        assert [m["role"] for m in r.messages] == ["user", "assistant", "user"]
        assert all(m["content"].strip() for m in r.messages)
    as_text = [json.dumps(r.messages, sort_keys=True) for r in rows]
    assert len(set(as_text)) == 96
    assert len({r.messages[-1]["content"].strip().lower() for r in rows}) == 96
    # the first 32 (what doctor reads) mix every category
    assert {r.category for r in rows[:32]} == CATEGORIES


def test_natural_set_keeps_every_line_whole():
    """Each line of the file is one {"category", "messages"} object whose messages end with the
    user's turn (nothing in the file is cut off by the reader)."""
    lines = [json.loads(line) for line in NATURAL_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) == 96
    assert all(set(line) == {"category", "messages"} for line in lines)
    assert [line["messages"] for line in lines] == read_prompts("natural")


def test_natural_prompts_are_not_builtin_templates():
    rows = read_prompt_rows("natural")
    texts = [m["content"] for r in rows for m in r.messages]
    builtin = set(builtin_prompts(4600)) | set(builtin_prompts(None, split="holdout"))
    assert len(builtin) > 4000
    assert not {t.strip() for t in texts} & builtin
    seen = set().union(*(ngrams(p) for p in builtin_prompts(2000)))
    shared = {t: ngrams(t) & seen for t in texts}
    assert not any(shared.values()), {t: s for t, s in shared.items() if s}


def test_natural_file_ships_in_the_wheel():
    package_data = read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]["package-data"]["specdraft"]
    src = ROOT / "src" / "specdraft"
    assert any(NATURAL_FILE.resolve() in {p.resolve() for p in src.glob(pattern)} for pattern in package_data)
    assert NATURAL_FILE.resolve() == (src / "data" / "natural.jsonl").resolve()
    assert (ROOT / "benchmarks" / "prompts" / "natural.jsonl").resolve() == NATURAL_FILE.resolve()


def test_multi_turn_lines_prompt_up_to_their_last_user_turn(tmp_path):
    u1, a1, u2, a2 = ({"role": r, "content": c} for r, c in
                      [("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")])
    system = {"role": "system", "content": "be brief"}
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(line) for line in [
        {"category": "chat", "messages": [u1, a1, u2]},
        {"messages": [system, u1, a1, u2, a2]},          # ends with an answer: prompts up to q2
        {"messages": [u1, a1]},
        {"messages": [a1]},                              # no user turn: not a prompt
        {"category": "plain", "prompt": "hi"},
    ]) + "\n")
    assert read_prompts(str(f)) == [[u1, a1, u2], [system, u1, a1, u2], [u1], [{"role": "user", "content": "hi"}]]
    assert [r.category for r in read_prompt_rows(str(f))] == ["chat", None, None, "plain"]
    assert read_prompts(str(f), limit=2) == [[u1, a1, u2], [system, u1, a1, u2]]

    for name, line, error in [
        ("none.jsonl", {"messages": [u1, {"role": "assistant", "content": None}, u2]}, "none.jsonl:1: assistant content is null"),
        ("cat.jsonl", {"category": 3, "messages": [u1]}, "cat.jsonl:1: category is 3"),
        ("odd.jsonl", {"messages": [u1, "a1", u2]}, "odd.jsonl:1: message 1 is \"a1\", not an object"),
    ]:
        bad = tmp_path / name
        bad.write_text(json.dumps(line) + "\n")
        with pytest.raises(SpecdraftError, match=re.escape(error)) as info:
            read_prompts(str(bad))
        assert len(str(info.value).splitlines()) == 1
    # an answer after the last user turn is never prompted, so a placeholder there is no error
    tail = tmp_path / "tail.jsonl"
    tail.write_text(json.dumps({"messages": [u1, {"role": "assistant", "content": None}]}) + "\n")
    assert read_prompts(str(tail)) == [[u1]]
