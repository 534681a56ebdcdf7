"""prepare --budget-minutes M: regenerate in rounds of 2 x --batch-size conversations more (each
round the first `size` of the same seeded order, up to --limit) while the time left fits a batch at the last
round's pace (the last round may be smaller); prepare.json records the rounds. On the tiny target."""

import json
import subprocess
import sys

import pytest

from specdraft.data import prepare as prepare_module
from specdraft.data.prepare import prepare, summary_lines
from specdraft.data.prepared import load_prepared

pytestmark = pytest.mark.usefixtures("one_thread")

KW = dict(regenerate=True, batch_size=2, max_new_tokens=4)


def mixture(tmp_path) -> str:
    """builtin prompts and a file's, half each (the file's answers are rewritten by the target)."""
    path = tmp_path / "asked.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"file question {i}"},
                                                     {"role": "assistant", "content": "written"}]}) + "\n"
                            for i in range(10)))
    return f"builtin:0.5,{path}:0.5"


def kept(meta: dict) -> int:
    """Samples kept plus the answers dropped as empty (the tiny random target may end its turn at once)."""
    return meta["counts"]["samples"] + meta["counts"]["dropped"]["empty_answer"]


def first_turns(out) -> set[str]:
    return {json.loads(m)[0]["content"] for m in load_prepared(out)[0]["messages"]}


def test_a_budget_that_holds_everything_regenerates_the_same_conversations_as_limit(tiny_target, tmp_path):
    MIX = mixture(tmp_path)
    plain = prepare(str(tiny_target), MIX, tmp_path / "plain", limit=8, **KW)
    meta = prepare(str(tiny_target), MIX, tmp_path / "budget", limit=8, budget_minutes=60, **KW)
    budget = meta["regeneration"]["budget"]
    assert budget == {**budget, "minutes": 60, "limit": 8, "reached": 8, "rounds": 2, "stopped": "limit"}
    assert len(budget["round_seconds"]) == 2
    # the same 8 questions as --limit 8 alone (each round a prefix of one seeded order), each answered once
    assert first_turns(tmp_path / "budget") == first_turns(tmp_path / "plain")
    assert meta["regeneration"]["generated"] == 8 == kept(meta) == kept(plain)
    assert [p["samples"] for p in meta["mixture"]] == [4, 4] and meta["limit"] == 8
    assert "8 of --limit 8 conversations regenerated in 2 round(s)" in summary_lines(meta, tmp_path)[1]

    again = prepare(str(tiny_target), MIX, tmp_path / "budget", limit=8, budget_minutes=60, **KW)   # resumes
    assert again["regeneration"]["generated"] == 0 and again["regeneration"]["reused"] == 8
    assert first_turns(tmp_path / "budget") == first_turns(tmp_path / "plain")


def test_rounds_stop_where_the_next_would_end_past_the_budget(tiny_target, tmp_path, monkeypatch):
    """A clock where every round takes 10 s: a 30 s budget runs rounds ending at 10, 20 and 30 s
    and starts no fourth (it would end at 40 s)."""
    clock = [0.0]
    answer_all = prepare_module.answer_all

    def ten_seconds(*args):
        clock[0] += 10
        return answer_all(*args)

    monkeypatch.setattr(prepare_module.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(prepare_module, "answer_all", ten_seconds)
    meta = prepare(str(tiny_target), "builtin", tmp_path / "out", limit=20, budget_minutes=0.5, **KW)
    budget = meta["regeneration"]["budget"]
    assert (budget["rounds"], budget["reached"], budget["stopped"]) == (3, 12, "budget")
    assert budget["round_seconds"] == [10, 10, 10]
    assert meta["regeneration"]["generated"] == 12 == kept(meta)
    assert "one more batch would have ended past the budget" in summary_lines(meta, tmp_path)[1]


def test_the_budget_ends_with_a_last_smaller_round(tiny_target, tmp_path, monkeypatch):
    """Issue 56: 5 s per batch of 2 and a 25 s budget: rounds of 2 batches end at 10 and 20 s, and the 5 s
    left fit one batch more (a last round of 2 conversations), where whole rounds stopped at 8 conversations."""
    clock = [0.0]
    answer_all = prepare_module.answer_all

    def five_seconds_a_batch(job, answer, new):
        clock[0] += 5 * -(-len(new) // 2)
        return answer_all(job, answer, new)

    monkeypatch.setattr(prepare_module.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(prepare_module, "answer_all", five_seconds_a_batch)
    meta = prepare(str(tiny_target), "builtin", tmp_path / "out", limit=20, budget_minutes=25 / 60, **KW)
    budget = meta["regeneration"]["budget"]
    assert (budget["rounds"], budget["reached"], budget["stopped"]) == (3, 10, "budget")
    assert budget["round_seconds"] == [10, 10, 5] and kept(meta) == 10
    assert prepare_module.next_round_size(10, 4, 20, (5.0, 2), 4.9, 2) is None      # less than a batch left
    assert prepare_module.next_round_size(10, 4, 12, (5.0, 2), 60, 2) == 12          # never past --limit
    assert prepare_module.next_round_size(4, 4, 8, (0.0, 4), -0.5, 2) is None       # a 0 s round, budget spent


def test_the_first_round_always_runs(tiny_target, tmp_path):
    meta = prepare(str(tiny_target), "builtin", tmp_path / "out", limit=8, budget_minutes=1e-6, **KW)
    assert meta["regeneration"]["budget"]["reached"] == 4 == kept(meta)


@pytest.mark.parametrize("flags, expected", [
    (["--conversations", "builtin", "--limit", "8"], "add --regenerate"),
    (["--conversations", "builtin", "--regenerate"], "add --limit N"),
    (["--conversations", "builtin", "--regenerate", "--limit", "8", "--part", "1/2"], "drop --part"),
    (["--conversations", "builtin", "--regenerate", "--limit", "8", "--budget-minutes", "0"], "must be > 0"),
])
def test_bad_budgets_are_one_line_exit_2(tiny_target, tmp_path, flags, expected):
    budget = [] if "--budget-minutes" in flags else ["--budget-minutes", "5"]
    proc = subprocess.run([sys.executable, "-m", "specdraft.cli", "prepare", "--model", str(tiny_target), *flags,
                           *budget, "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: --budget-minutes ") and expected in err, err
    assert not (tmp_path / "out" / "prepare.json").exists()


def test_a_source_smaller_than_limit_ends_the_rounds_and_is_said(tiny_target, tmp_path):
    """A file of 3 conversations with --limit 40: the summary said '40 of --limit 40 conversations regenerated'
    (conversations that never existed); now the rounds stop where the source ends, and say so."""
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question number {i} here"}]}) + "\n"
                            for i in range(3)))
    meta = prepare(str(tiny_target), str(path), tmp_path / "out", limit=40, budget_minutes=5, **KW)
    budget = meta["regeneration"]["budget"]
    assert (budget["reached"], budget["limit"], budget["stopped"], budget["rounds"]) == (3, 40, "source", 1)
    line = next(x for x in summary_lines(meta, tmp_path / "out") if x.startswith("--budget-minutes"))
    assert "3 of --limit 40 conversations regenerated" in line and "all the source holds" in line


def test_self_written_questions_are_inside_the_budget(tiny_target, tmp_path, capsys):
    """`self:N` with --budget-minutes wrote all N questions before the first round (a small Qwen3 printed
    'writing questions: 1/64 ... eta 2:54:29' inside a 5-minute budget): a round writes the questions it answers
    (never past its size), no batch of them starts once the budget is spent, and the summary says so."""
    from specdraft.data.self_prompts import QUESTIONS_FILE

    meta = prepare(str(tiny_target), "self:12", tmp_path / "out", limit=12, budget_minutes=1e-6, **KW)
    batches = (tmp_path / "out" / QUESTIONS_FILE).read_text().splitlines()
    assert len(batches) == 1                                        # one batch of 2, not 6 (all 12) up front
    written = len(set(json.loads(batches[0])["questions"]))         # the distinct questions of that batch
    budget = meta["regeneration"]["budget"]
    assert (budget["reached"], budget["stopped"]) == (written, "budget") and kept(meta) == written < 4
    assert f"the budget ran out while the target wrote questions; {written} of 4 written" in capsys.readouterr().err
