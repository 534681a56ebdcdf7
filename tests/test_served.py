"""bench --engine vllm without starting vLLM: options, waves, the summary against plain, the verdict, the
file's reader, and the recipe's closing verdict read from it. vLLM itself serves in test_vllm_archs.py."""

from __future__ import annotations

import json

import pytest

from specdraft.errors import SpecdraftError
from specdraft.infer import served


def test_ks_methods_and_unused_options_are_checked():
    assert served.parse_ks(None, 2) == [2]
    assert served.parse_ks("3,1,2,1", 2) == [1, 2, 3]
    for bad, message in (("auto", "give the Ks to measure"), ("0", "must be 1..256"), ("1,x", "whole numbers")):
        with pytest.raises(SpecdraftError, match=message):
            served.parse_ks(bad, 2)
    assert served.served_methods(None, "eagle3") == ["plain", "ngram", "eagle3"]
    assert served.served_methods("eagle3", "eagle3") == ["plain", "eagle3"]       # plain is always the baseline
    assert served.served_methods(None, None) == ["plain", "ngram"]
    with pytest.raises(SpecdraftError, match="hybrid: vLLM serves plain, ngram, eagle3.*specdraft's loop only"):
        served.served_methods("plain,hybrid", "eagle3")
    with pytest.raises(SpecdraftError, match="pass --drafter"):
        served.served_methods("eagle3", None)
    served.check_unused({"--tree": None, "--compile": False})
    with pytest.raises(SpecdraftError, match="--datastore: applies to specdraft's loop only"):
        served.check_unused({"--tree": None, "--datastore": "ws/data"})


def test_every_wave_has_its_own_plain_engine():
    configs = served.configs(["plain", "ngram", "eagle3"], [1, 2, 3], None, {"method": "eagle3"}, (2, 4))
    assert [c.key for c in configs] == ["plain", "ngram@k1", "eagle3@k1", "ngram@k2", "eagle3@k2", "ngram@k3",
                                        "eagle3@k3"]
    assert configs[1].spec == {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 2,
                               "prompt_lookup_max": 4}
    assert configs[2].spec["num_speculative_tokens"] == 1 and configs[2].spec["method"] == "eagle3"
    waves = served.waves(configs, 4)
    assert [[c.key for c in w] for w in waves] == [["plain", "ngram@k1", "eagle3@k1", "ngram@k2"],
                                                   ["plain", "eagle3@k2", "ngram@k3", "eagle3@k3"]]
    assert served.waves(configs[:1], 4) == [configs[:1]]


def result(tps, outputs, accepted=None, drafts=None):
    counters = {"num_drafts": drafts, "num_accepted_tokens": accepted} if drafts else {}
    return {"tokens_per_s": tps, "tokens": 10, "outputs": outputs, "counters": counters}


def test_summary_is_against_the_plain_of_its_wave():
    plain = {1: [result(10.0, [[1, 2]]), result(12.0, [[1, 2]])], 4: [result(40.0, [[1, 2]])]}
    ours = {1: [result(15.0, [[1, 2]], 3, 6), result(13.0, [[1, 2]], 3, 6)], 4: [result(30.0, [[1, 3]], 6, 12)]}
    row = served.summarize(served.Config("eagle3", 2), ours, plain)
    assert row["batches"]["1"]["x_plain"] == pytest.approx(14.0 / 11.0)          # medians over rounds
    assert row["batches"]["1"]["vllm_tau"] == pytest.approx(1 + 6 / 12)          # counters summed over rounds
    assert row["batches"]["1"]["outputs_equal_plain"] is True
    assert row["batches"]["4"]["outputs_equal_plain"] is False                   # a changed output is said
    assert row["batches"]["4"]["x_plain"] == pytest.approx(0.75)


def report(x1, xn, ngram=1.1):
    def row(method, k, a, b, tau=None):
        return {"method": method, "k": k, "batches": {"1": {"tokens_per_s": 20 * a, "x_plain": a, "vllm_tau": tau},
                                                      "6": {"tokens_per_s": 100 * b, "x_plain": b}}}
    return {"engine": "vllm", "vllm_version": "0.32.0", "errors": {},
            "config": {"batches": [1, 6], "cpu": "AMD EPYC (avx512-bf16)", "model": "m", "num_prompts": 6,
                       "prompts": "natural", "max_new_tokens": 96, "vllm_dtype": "float32"},
            "results": {"plain (wave 1)": {"method": "plain", "k": None,
                                           "batches": {"1": {"tokens_per_s": 20.0}, "6": {"tokens_per_s": 100.0}}},
                        "ngram@k2": row("ngram", 2, ngram, 0.8, 1.5), "eagle3@k2": row("eagle3", 2, x1, xn, 1.4),
                        "eagle3@k3": row("eagle3", 3, x1 + 0.1, xn - 0.1, 1.5)}}


def test_verdict_names_the_engine_its_baseline_and_both_batches():
    line = served.verdict(report(1.3, 1.1))
    assert line.startswith("in vLLM 0.32.0 on this machine (AMD EPYC (avx512-bf16)): eagle3 K=3 is 1.40x vLLM "
                           "plain decoding at batch 1, 1.00x at batch 6 (vLLM's n-gram K=2: 1.10x at batch 1)")
    assert "serve without speculation" not in line
    slow = served.verdict(report(0.8, 0.7, ngram=0.9))
    assert "serve without speculation on this machine" in slow
    assert served.drafter_row(report(1.3, 1.1), 2)["k"] == 2                    # the export's K first
    assert served.drafter_row(report(1.3, 1.1), None)["k"] == 3                 # else the best at batch 1
    assert "vLLM plain" in str(served.table(report(1.3, 1.1)).title)


def test_report_reader_names_the_bad_field(tmp_path):
    from specdraft.schemas.bench_vllm import read_report

    path = tmp_path / "bench_vllm.json"
    assert read_report(path) is None
    good = report(1.3, 1.1)
    path.write_text(json.dumps(good))
    assert read_report(path) == good
    good["results"]["eagle3@k2"]["batches"]["1"]["x_plain"] = "fast"
    path.write_text(json.dumps(good))
    with pytest.raises(SpecdraftError, match=r"bench_vllm.json: field 'results.eagle3@k2.batches.1.x_plain' is \"fast\""):
        read_report(path)


def test_specdraft_loop_refuses_vllm_only_options():
    from specdraft.infer.methods import check_served_only

    check_served_only({"--batch": None, "--breakdown": False})
    with pytest.raises(SpecdraftError, match="--batch: applies to --engine vllm only"):
        check_served_only({"--batch": 8, "--breakdown": False})


def closing_with(tmp_path, served_report, over_plain=0.95, tau=1.8):
    from specdraft.pipeline import closing, load_recipe, recipe_file

    run, export = tmp_path / "ws" / "runs" / "quick", tmp_path / "ws" / "export" / "speculators"
    run.mkdir(parents=True, exist_ok=True)
    export.mkdir(parents=True, exist_ok=True)
    (export / "export.json").write_text(json.dumps({"run": str(run.resolve()), "num_speculative_tokens": 2}))
    natural = {"methods": {"plain": {"tokens_per_s": 20.0},
                           "eagle3": {"accept_len": tau, "speedup": 1.3, "speedup_over_plain": over_plain}},
               "config": {"k": 2, "prompts": "natural", "num_prompts": 6, "family": "eagle3"}}
    return closing("default", load_recipe(recipe_file("quick")), run, export, natural, 1, None,
                   served_report=served_report)


def test_the_recipe_verdict_is_about_vllm_where_vllm_measured(tmp_path):
    """Issue 56: the verdict's baseline is plain decoding, in the engine users serve with where it ran; the line
    beside it is bench --engine vllm's own; without vLLM the verdict is specdraft's loop against its plain."""
    fast = closing_with(tmp_path, report(1.3, 1.1))
    assert fast["verdict"].startswith("good: served by vLLM on this machine, eagle3 K=2 is 1.30x vLLM's plain "
                                      "decoding at batch 1; specdraft's loop: 0.95x its plain decoding at τ 1.80")
    assert fast["vllm"] == served.verdict(report(1.3, 1.1))
    slow = closing_with(tmp_path, report(0.9, 0.7, ngram=0.95))
    assert "vLLM on this machine does not turn it into speed (0.90x its plain decoding at batch 1): serve without " \
           "speculation here" in slow["verdict"]
    missing = closing_with(tmp_path, "not measured: vLLM is not installed here", over_plain=1.2)
    assert missing["vllm"] == "not measured: vLLM is not installed here"
    assert missing["verdict"].startswith("good: eagle3 is 1.20x plain decoding (specdraft's loop without drafts)")
    low = closing_with(tmp_path, report(1.3, 1.1), tau=1.2)
    assert low["verdict"].startswith("low: τ 1.20 at K=2")                       # "good" only where τ agrees


def test_recipe_workspaces_are_named_after_the_model_not_its_path(tmp_path):
    from specdraft.pipeline import model_name, recipe_choice

    folder = tmp_path / "models" / "qwen3-tiny"
    folder.mkdir(parents=True)
    assert model_name(str(folder) + "/") == "qwen3-tiny"
    assert model_name("../x/models/Qwen3-0.6B") == "Qwen3-0.6B"
    assert model_name("/data/kimi.Q4_K_M.gguf") == "kimi.Q4_K_M"
    assert model_name("moonshotai/Kimi-K2.5") == "moonshotai--Kimi-K2.5" and model_name("default") == "default"
    assert recipe_choice(str(folder), None, None, None)[1].name == "qwen3-tiny-quick"


def test_a_flat_verify_curve_adds_hybrid_tree_and_the_hybrid_line_leads_with_the_fastest(tmp_path):
    """Issue 56 item 6: where -k auto measured a flat verify (bf16, --compile, a GPU) the natural bench also runs
    hybrid-tree; the hybrid line gives each method's gain over plain decoding, the drafter alone beside it."""
    from specdraft.pipeline import hybrid_line, verify_is_flat

    def bench(verify):
        return {"config": {"k_auto": {"verify_ms": verify}}}
    assert verify_is_flat(bench([40.0, 41.0, 42.0, 45.0, 48.0])) is True
    assert verify_is_flat(bench([37.0, 36.0, 44.0, 43.0, 50.0, 56.0, 66.0, 61.0])) is False   # fp32 on an EPYC
    assert verify_is_flat({}) is False and verify_is_flat(bench([1.0, "x", 1.0, 1.0])) is False
    run = tmp_path / "run"
    run.mkdir()
    (run / "bench_natural.json").write_text(json.dumps({
        "methods": {"plain": {}, "ngram": {"accept_len": 1.4, "speedup_over_plain": 1.1},
                    "eagle3": {"accept_len": 1.8, "speedup_over_plain": 1.2},
                    "hybrid": {"accept_len": 1.9, "speedup_over_plain": 1.3},
                    "hybrid-tree": {"accept_len": 2.2, "speedup_over_plain": 1.6}},
        "config": {"k": 2, "prompts": "natural", "num_prompts": 6, "family": "eagle3", "tree": [4, 4, 16]}}))
    line = hybrid_line(run)
    assert line.startswith("hybrid-tree τ 2.20 at K=16 on 6 natural prompts, 1.60x plain decoding; hybrid τ 1.90 at "
                           "K=2 on 6 natural prompts, 1.30x plain decoding; eagle3 τ 1.80 at K=2")
