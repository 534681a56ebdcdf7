"""Issue 36, "one τ": every τ the tool prints names its K and its prompts, in one format
(metrics.tau_text), so that 1.47 at K=1 on builtin prompts and 1.815 at K=3 on held-out store samples
are never read as the same number."""

from __future__ import annotations

import re

from rich.console import Console

from specdraft.metrics import tau_source, tau_text

TAU = re.compile(r"τ \d+\.\d+ at K=\d+ on \S")


def test_tau_text_names_k_and_the_prompt_set():
    assert tau_text(1.8149, 3, "held-out", 26) == "τ 1.81 at K=3 on 26 held-out store samples"
    assert tau_text(1.47, 1, "builtin-holdout", 6) == "τ 1.47 at K=1 on 6 builtin hold-out prompts"
    assert tau_text(2.04, 3, "natural") == "τ 2.04 at K=3 on natural prompts"
    assert tau_text(2.0, 2, "mine.jsonl", 4) == "τ 2.00 at K=2 on 4 of your prompts (mine.jsonl)"
    assert tau_text(None, None, None) == "τ unknown at K=? on unknown prompts (they may include training data)"
    assert tau_source("all", 256) == "256 all store samples (training data included)"


def bench_report() -> dict:
    row = {"tokens_per_s": 10.0, "speedup": 1.0, "accept_len": 1.0, "per_position_accept": [],
           "identical_to_greedy": True, "prompts_identical": 6}
    return {"methods": {"greedy": row, "ngram": {**row, "accept_len": 1.3, "per_position_accept": [0.2, 0.1, 0.0]},
                        "eagle3": {**row, "accept_len": 1.47, "per_position_accept": [0.47]}},
            "config": {"model": "m", "num_prompts": 6, "max_new_tokens": 96, "rounds": 3, "k": 1,
                       "prompts": "builtin-holdout", "k_auto": {"k_auto": True}, "tree": None}}


def test_bench_table_names_each_methods_k_and_the_prompts():
    from specdraft.infer.bench_output import bench_table

    console = Console(width=200, record=True)
    console.print(bench_table(bench_report()))
    text = " ".join(console.export_text().split())
    assert "6 builtin hold-out prompts" in text and "at most K+1" in text
    assert "1.47 (K=1)" in text and "1.30 (K=3)" in text and "1.00 (K=0)" in text   # n-gram keeps K=3 under -k auto


def test_eval_and_doctor_print_tau_with_k_and_samples():
    from specdraft.analysis import doctor, evaluate

    ev = {"split": "val (26 held-out samples of the run)", "split_name": "held-out", "samples": 26, "k": 3,
          "accept_len": 1.815, "cond_acc": [0.5, 0.4, 0.3], "accept_len_by_k": [1.0, 1.5, 1.7, 1.815]}
    assert "τ 1.815 at K=3 on 26 held-out store samples" in evaluate.format_result(ev)
    found = {"run": "ws/runs/quick", "checkpoint": "ws/runs/quick/best", "tau_held_out": 1.86, "steps": 4,
             "samples": 32, "causes": [], "checked": [], "skipped": []}
    assert doctor.format_result(found).startswith("doctor ws/runs/quick: τ 1.86 at K=4 on 32 held-out store samples")
    for text in (evaluate.format_result(ev), doctor.format_result(found)):
        assert all(TAU.match(m.group(0)) for m in re.finditer(r"τ \d[^\n]{0,20}", text))


def test_the_recipe_summary_table_names_k_and_prompts(tmp_path, capsys):
    from specdraft.pipeline import print_summary, summarize

    summary = summarize(bench_report(), 60.0)
    print_summary(Console(width=200), {**summary, "speedup_over_plain": {}}, tmp_path / "report.html")
    text = " ".join(capsys.readouterr().out.split())     # the table goes to stdout
    assert "6 builtin hold-out prompts" in text and "1.47 (K=1)" in text and "1.30 (K=3)" in text
