"""prepare --conversations builtin:0.5,self:0.5: a mixture of sources as shares of --limit
(data/mixture.py): parsing, largest-remainder counts, the interleaved order, the provenance in
prepare.json, a real prepare on the tiny target, and bad mixtures as one line, exit 2."""

import json
import random
import subprocess
import sys
from fractions import Fraction

import pytest

from specdraft.data.builtin_prompts import builtin_prompts
from specdraft.data.mixture import interleave, is_mixture, parse_mixture, part_counts
from specdraft.data.prepare import prepare
from specdraft.data.prepared import load_prepared
from specdraft.errors import SpecdraftError

pytestmark = pytest.mark.usefixtures("one_thread")


def conversations(tag: str, n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"{tag} question {i}"},
                          {"role": "assistant", "content": f"{tag} answer {i}"}]} for i in range(n)]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_which_sources_are_mixtures(tmp_path):
    existing = write_jsonl(tmp_path / "a:1.jsonl", conversations("a", 1))
    assert is_mixture("builtin:0.5,self:0.5") and is_mixture("builtin:0.7") and is_mixture("a.jsonl:1,b.jsonl:1")
    assert is_mixture("pydoc:1,builtin:1") and is_mixture("pydoc:0.5") and not is_mixture("pydoc")
    assert is_mixture("builtin:x") and is_mixture("org/ds:2")       # refused by parse_mixture, not read as a hub id
    for single in ["builtin", "self", "self:5", "org/ds", "data.jsonl", str(existing)]:
        assert not is_mixture(single), single


def test_parse_normalises_the_weights_into_shares_of_limit():
    parts = parse_mixture("builtin:0.5,self:0.5", 4)
    assert [p.record() for p in parts] == [{"source": "builtin", "weight": 0.5, "share": 0.5, "samples": 2},
                                           {"source": "self", "weight": 0.5, "share": 0.5, "samples": 2}]
    parts = parse_mixture(" builtin:3 , self:1", 10)
    assert [(p.source, p.share, p.samples) for p in parts] == [("builtin", 0.75, 8), ("self", 0.25, 2)]
    [only] = parse_mixture("builtin:0.7", 5)          # a weight on a single source: all of --limit
    assert (only.source, only.share, only.samples) == ("builtin", 1.0, 5)


def test_counts_are_rounded_by_largest_remainder():
    assert part_counts([1, 1, 1], 10) == [4, 3, 3]            # ties go to the earlier part
    assert part_counts([0.2, 0.3, 0.5], 7) == [1, 2, 4]       # quotas 1.4, 2.1, 3.5
    assert part_counts([0.25, 0.75], 4) == [1, 3]
    rng = random.Random(0)
    for _ in range(200):
        weights = [rng.uniform(0.01, 5) for _ in range(rng.randint(1, 6))]
        limit = rng.randint(1, 1000)
        counts = part_counts(weights, limit)
        assert sum(counts) == limit
        quotas = [Fraction(w) * limit / sum(map(Fraction, weights)) for w in weights]
        assert all(abs(c - q) < 1 for c, q in zip(counts, quotas))


def test_interleave_spreads_each_part_by_its_share():
    assert interleave([["a", "a"], ["b", "b"]]) == ["a", "b", "a", "b"]
    assert interleave([[1, 2, 3], ["x"]]) == [1, 2, "x", 3]
    assert interleave([[], ["x", "y"]]) == ["x", "y"]
    mixed = interleave([list(range(75)), ["s"] * 25])
    assert all(mixed[i:i + 4].count("s") == 1 for i in range(0, 100, 4))


@pytest.mark.parametrize("source, limit, error", [
    ("builtin:0", 4, "part 'builtin:0': the weight must be a positive number"),
    ("builtin:-1,self:1", 4, "part 'builtin:-1': the weight must be a positive number"),
    ("builtin:x", 4, "part 'builtin:x': weight 'x' is not a number"),
    ("builtin:0.5,builtin:0.5", 4, "part 'builtin' is given twice"),
    ("builtin:0.5,foo:0.5", 4, "unknown part 'foo'"),
    ("builtin:0.5,self", 4, "part 'self' has no weight"),
    ("builtin:0.5,self:3:1", 4, "part 'self:3': in a mixture self takes its count from its weight"),
    ("builtin:0.5,missing.jsonl:0.5", 4, "part 'missing.jsonl': file not found"),
    ("builtin:0.5,", 4, "an empty part"),
    ("builtin:0.5,self:0.5", None, "a mixture needs --limit"),
])
def test_bad_mixtures_are_refused(source, limit, error):
    with pytest.raises(SpecdraftError, match=rf"^--conversations {source}: .*") as info:
        parse_mixture(source, limit)
    assert error in str(info.value) and len(str(info.value).splitlines()) == 1


def test_a_file_mixture_draws_seeded_shares_and_records_them(tiny_target, tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", conversations("alpha", 6))
    b = write_jsonl(tmp_path / "b.jsonl", conversations("beta", 6))
    source = f"{a}:3,{b}:1"
    meta = prepare(str(tiny_target), source, tmp_path / "out", limit=4)
    ds, saved = load_prepared(tmp_path / "out")
    assert saved == meta and meta["source_kind"] == "mixture" and meta["counts"]["samples"] == 4
    assert meta["mixture"] == [{"source": str(a), "weight": 3.0, "share": 0.75, "samples": 3},
                               {"source": str(b), "weight": 1.0, "share": 0.25, "samples": 1}]
    firsts = [json.loads(m)[0]["content"] for m in ds["messages"]]
    assert [f.split()[0] for f in firsts] == ["alpha", "alpha", "beta", "alpha"]
    assert len(set(firsts)) == 4
    prepare(str(tiny_target), source, tmp_path / "again", limit=4)
    assert load_prepared(tmp_path / "again")[0]["messages"] == ds["messages"]
    other = prepare(str(tiny_target), source, tmp_path / "seed1", limit=4, seed=1)
    assert other["mixture"] == meta["mixture"]
    assert sorted(load_prepared(tmp_path / "seed1")[0]["messages"]) != sorted(ds["messages"])
    with pytest.raises(SpecdraftError, match=r"^--conversations .*: part '.*a.jsonl' has 6 conversations, its share of --limit is 10;"):
        prepare(str(tiny_target), f"{a}:1,{b}:1", tmp_path / "short", limit=20)
    for part in ("builtin", "self"):   # prompts without answers: the target must write them
        with pytest.raises(SpecdraftError, match=rf"^--conversations {a}:1,{part}:1: part '{part}' is questions "
                                                 "without answers; pass --regenerate"):
            prepare(str(tiny_target), f"{a}:1,{part}:1", tmp_path / "no-regen", limit=4)


def test_pydoc_answers_are_pythons_documentation_as_written(tiny_target, tmp_path):
    """`--conversations pydoc`: chat turns whose answers are the interpreter's documentation, the data
    that needs no regeneration (the teacher is the target at every position anyway); seeded, a part
    of a mixture like any file, and questions only under --regenerate (the target answers them)."""
    from specdraft.data.conversations import load_conversations
    from specdraft.data.documents import PYDOC_ANSWER_CHARS, pydoc_pairs

    pairs = pydoc_pairs()
    assert len(pairs) > 300 and all(0 < len(a) <= PYDOC_ANSWER_CHARS for _, a in pairs)
    assert any(q == "Explain the Python topic 'pass'." for q, _ in pairs)           # the language reference
    assert any(q.startswith("What does `json.") for q, _ in pairs)                   # stdlib docstrings, by ast
    meta = prepare(str(tiny_target), "pydoc", tmp_path / "docs", limit=5)
    ds, _ = load_prepared(tmp_path / "docs")
    turns = [json.loads(m) for m in ds["messages"]]
    assert meta["counts"]["samples"] == 5 and [t["role"] for t in turns[0]] == ["user", "assistant"]
    assert all((t[0]["content"], t[1]["content"]) in set(pairs) for t in turns)
    assert meta["counts"]["loss_tokens"] > 5 * 20 and not meta.get("regeneration")
    again = [c.messages for c in load_conversations("pydoc", seed=0, limit=5)]
    assert again == turns and again != [c.messages for c in load_conversations("pydoc", seed=1, limit=5)]
    asked = list(load_conversations("pydoc", limit=2, regenerate=True))
    assert [[t["role"] for t in c.messages] for c in asked] == [["user"], ["user"]]
    a = write_jsonl(tmp_path / "a.jsonl", conversations("alpha", 6))
    mixed = prepare(str(tiny_target), f"{a}:1,pydoc:1", tmp_path / "mixed", limit=4)
    assert [p["source"] for p in mixed["mixture"]] == [str(a), "pydoc"] and mixed["counts"]["samples"] == 4


def test_builtin_and_self_mixture_prepares_on_the_tiny_target(tiny_target, tmp_path):
    """builtin and self both need the target to answer (--regenerate); self writes its 2 questions
    in-process on the tiny target, as `self:N` does."""
    from specdraft.data.self_prompts import QUESTIONS_FILE

    meta = prepare(str(tiny_target), "builtin:0.5,self:0.5", tmp_path / "out", regenerate=True, limit=4,
                   batch_size=4, max_new_tokens=6)
    ds, saved = load_prepared(tmp_path / "out")
    assert saved == meta and meta["counts"]["samples"] == 4 and meta["source_kind"] == "mixture"
    assert [(p["source"], p["weight"], p["samples"]) for p in meta["mixture"]] == [("builtin", 0.5, 2),
                                                                                  ("self", 0.5, 2)]
    assert meta["questions"] == str(tmp_path / "out" / QUESTIONS_FILE)
    questions = [q for line in (tmp_path / "out" / QUESTIONS_FILE).read_text().splitlines()
                 for q in json.loads(line)["questions"]]
    prompts = [json.loads(m)[0]["content"] for m in ds["messages"]]
    builtin = builtin_prompts(2, seed=0)
    assert [prompts[0], prompts[2]] == builtin                    # interleaved: builtin, self, builtin, self
    assert prompts[1] in questions and prompts[3] in questions and prompts[1] != prompts[3]
    assert all(json.loads(m)[-1]["role"] == "assistant" for m in ds["messages"])


def test_bad_mixtures_through_the_cli_are_one_line_exit_2(tiny_target, tmp_path):
    cases = [(["builtin:0"], "part 'builtin:0': the weight must be a positive number"),
             (["builtin:x"], "weight 'x' is not a number"),
             (["builtin:0.5,builtin:0.5"], "part 'builtin' is given twice"),
             (["builtin:0.5,foo:0.5"], "unknown part 'foo'"),
             (["builtin:0.5,self:0.5", "--no-limit"], "a mixture needs --limit")]
    runs = []
    for i, ((source, *flags), _) in enumerate(cases):
        limit = [] if "--no-limit" in flags else ["--limit", "4"]
        runs.append(subprocess.Popen([sys.executable, "-m", "specdraft.cli", "prepare", "--model", str(tiny_target),
                                      "--conversations", source, "--regenerate", *limit,
                                      "--out", str(tmp_path / f"out-{i}")],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for i, (((source, *_), expected), proc) in enumerate(zip(cases, runs)):
        _, stderr = proc.communicate(timeout=300)
        err = stderr.strip()
        assert proc.returncode == 2, (source, stderr)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (source, err)
        assert f"--conversations {source}: " in err and expected in err, (source, err)
        assert not (tmp_path / f"out-{i}" / "prepare.json").exists()
