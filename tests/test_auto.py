"""Issue 17 part 4-5: the loop keeps what τ earns. `-k auto` picks the K a brute-force sweep of the
cost model picks; the confidence stop never changes greedy output; the drafter's preallocated cache
behaves as the growing one; bench and plan time in interleaved rounds and say when the machine was
busy or verify cost was not monotonic. No timed assertions: only shapes, choices and equalities."""

import json
import random

import pytest
import torch
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.errors import SpecdraftError
from specdraft.infer import auto, timing
from specdraft.infer.costmodel import chain_options, conditional, expected_tokens, stop_threshold
from specdraft.model.common.cache import GrowingKVCache
from specdraft.model.eagle3.proposer import EagleProposer
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import generate
from specdraft.model.eagle3.module import DynamicCache
from specdraft.testing import tiny_drafter_for, tiny_llama

AUX = [0, 2, 3]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=5)


@pytest.fixture(scope="module")
def drafter(target):
    d = tiny_drafter_for(target, AUX, every=2, seed=1)
    with torch.no_grad():                   # sharpen it: top-1 probabilities spread over (0, 1)
        d.lm_head.weight.mul_(5.0)
    return d.eval()


def hf_greedy(model, prompt, n):
    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         eos_token_id=2, pad_token_id=0)
    return out[0, len(prompt):].tolist()


# ----------------------------------------------------------------------------- -k auto = brute force

def brute_force_k(rates, verify_ms, draft_ms, k_max):
    """Independent of costmodel: throughput of every K >= 0 at every R >= K+1 written out (K=0: plain
    decoding, one token a round), the best (shortest on ties)."""
    best = None
    for k in range(0, k_max + 1):
        tokens, prod = 1.0, 1.0
        for j in range(k):
            prod *= rates[min(j, len(rates) - 1)]
            tokens += prod
        for r in range(k + 1, k_max + 2):
            cycle = k * draft_ms + verify_ms[min(r - 1, len(verify_ms) - 1)]
            if best is None or tokens / cycle > best[1] + 1e-12:
                best = (k, tokens / cycle)
    return best[0]


def test_auto_k_picks_what_a_brute_force_sweep_picks():
    rng = random.Random(0)
    seen = set()
    for _ in range(400):
        k_max = rng.randint(1, 10)
        rates = [rng.random() ** rng.choice([0.3, 1, 3]) for _ in range(rng.randint(1, 8))]
        base = rng.uniform(5, 100)
        slope = rng.choice([0.0, 0.01, 0.05, 0.2]) * base
        verify = [base + slope * n + rng.uniform(0, 0.01 * base) for n in range(k_max + 1)]
        draft = rng.uniform(0, 0.5) * base
        option, threshold = auto.decide(rates, verify, draft, None, stop_auto=False, k_max=k_max)
        assert option.k == brute_force_k(rates, verify, draft, k_max), (rates, verify, draft)
        assert threshold is None
        seen.add(option.k)
    assert len(seen) >= 5                   # the sweep exercised many different answers


def test_rounds_run_at_the_row_count_measured_cheapest():
    """The AVX-512 EPYC of issue 35: one row cost 58.1 ms that two rows did in 40.9. Plain decoding and a
    1-draft chain then both run at R=2; K=2 at 3 rows; the choice says R where it pads."""
    verify = [58.1, 40.9, 60.6, 66.0, 76.5]
    options = chain_options([0.5, 0.4, 0.3, 0.3], verify, 2.0, 4)
    assert [o.rows for o in options] == [2, 2, 3, 4, 5]
    assert options[0].cycle_ms == 40.9 and options[0].speedup == 1.0      # plain decoding at its best R
    assert options[1].cycle_ms == pytest.approx(42.9)
    option, _ = auto.decide([0.5, 0.4, 0.3, 0.3], verify, 2.0, None, stop_auto=False, k_max=4)
    choice = auto.AutoChoice(option.k, None, option, [0.5, 0.4, 0.3, 0.3], "val.json", verify, 2.0, True, False)
    assert (option.k, choice.rows) == (1, 2)
    plain = auto.AutoChoice(0, None, options[0], [0.5], "val.json", verify, 2.0, True, False)
    assert plain.rows == 2 and "every round at R=2 rows (40.9 ms" in plain.line()
    assert "R=" not in auto.AutoChoice(2, None, options[2], [0.5], "v", verify, 2.0, True, False).line()


def test_auto_k_is_zero_when_the_faked_costs_make_drafting_a_loss():
    """The Xeon of issue 23: a 2-token verify at 1.78x a 1-token forward; no chain pays, so -k auto
    decodes plainly (K=0) and says why in one line with the measured costs."""
    rates, verify, draft = [0.45, 0.3, 0.2], [58.2, 103.4, 106.0, 108.8, 113.7], 3.0
    option, threshold = auto.decide(rates, verify, draft, None, stop_auto=True, k_max=4)
    assert option.k == 0 and option.speedup == 1.0
    choice = auto.AutoChoice(0, None, option, rates, "val.json", verify, draft, True, True)
    line = choice.line()
    assert line.startswith("-k auto: K=0, plain decoding") and "\n" not in line
    assert "58.2 ms 1-token forward" in line and "103.4 ms 2-token verify" in line and "3.0 ms drafter step" in line
    # the same model with a flat verify drafts
    assert auto.decide(rates, [58.2, 60.0, 61.0, 62.0, 63.0], draft, None, stop_auto=False, k_max=4)[0].k >= 1


def test_bench_defaults_to_k_auto_and_decodes_plainly_where_no_chain_pays(tiny_target, tmp_path, monkeypatch):
    """No -k: bench's eagle3 chain takes -k auto; with faked costs that make every chain lose it runs as
    plain decoding (identical, τ 1.0), the choice is one line, and the report JSON says why."""
    from specdraft.infer.bench_output import why_not_faster

    def losing_costs(target_model, drafter, n_max, context, rounds=3, repeats=5, label=""):
        return {"verify_ms": [10.0 * (1 + n) for n in range(n_max)], "draft_ms": 5.0}
    monkeypatch.setattr(auto, "measure_costs", losing_costs)
    out = tmp_path / "bench.json"
    res = invoke("bench", "--model", tiny_target, "--drafter", "untrained:64", "--methods", "greedy,ngram,eagle3",
                 "--max-new-tokens", "8", "--limit", "2", "--rounds", "1", "--out", out)
    assert res.exit_code == 0, res.output
    assert sum("-k auto: K=0, plain decoding" in line for line in res.stderr.splitlines()) == 1, res.stderr
    report = json.loads(out.read_text())
    eagle = report["methods"]["eagle3"]
    assert report["config"]["k"] == 0 and eagle["identical_to_greedy"] and eagle["accept_len"] == 1.0
    assert report["config"]["k_auto_line"].startswith("-k auto: K=0")
    assert why_not_faster(report).startswith("eagle3 ran as plain decoding here. -k auto: K=0")
    assert report["methods"]["ngram"]["identical_to_greedy"]         # n-gram keeps its K=4
    # a fixed -k still works as asked
    res = invoke("bench", "--model", tiny_target, "--drafter", "untrained:64", "--methods", "greedy,eagle3",
                 "--max-new-tokens", "8", "--limit", "1", "--rounds", "1", "-k", "2", "--out", out)
    assert res.exit_code == 0 and "-k auto" not in res.stderr, res.output
    assert json.loads(out.read_text())["config"]["k"] == 2


def test_bench_runs_the_chain_and_plain_at_the_rows_k_auto_measured_cheapest(tiny_target, tmp_path, monkeypatch):
    """Issue 35's R per machine: with faked costs where 6 rows run cheaper than 1..5, -k auto's chain and plain
    decoding both run every round at R=6 (the chain's choice, and plain's own cheapest; eagle3 then equals
    plain, compared); n-gram keeps its own R; the choice line says R; greedy's tokens as ever (float32)."""
    def padded_costs(target_model, drafter, n_max, context, rounds=3, repeats=5, label=""):
        return {"verify_ms": [10.0, 20.0, 20.5, 21.0, 21.5, 9.0, 30.0, 30.0, 30.0][:n_max], "draft_ms": 0.5}
    monkeypatch.setattr(auto, "measure_costs", padded_costs)
    monkeypatch.setattr(auto, "gather_accept", lambda *a: ([0.9] + [0.05] * (a[-1] - 1), "faked", a[-1]))
    out = tmp_path / "bench.json"
    res = invoke("bench", "--model", tiny_target, "--drafter", "untrained:64", "--methods", "greedy,plain,ngram,eagle3",
                 "--max-new-tokens", "8", "--limit", "2", "--rounds", "1", "--out", out)
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    m = report["methods"]
    assert report["config"]["k"] == 1 and report["config"]["k_auto"]["rows"] == 6
    assert "every round at R=6 rows" in res.stderr
    assert m["eagle3"]["rows"] == m["plain"]["rows"] == 6 and m["ngram"]["rows"] == 4 and m["greedy"]["rows"] is None
    assert m["eagle3"]["identical_to_plain"] is True and "identical_to_plain" not in m["ngram"]
    assert all(r["identical_to_greedy"] for r in m.values())


def test_shape_rows_plain_runs_its_own_cheapest_r_in_float32_and_the_chains_otherwise():
    from specdraft.infer.methods import shape_rows

    verify = [10.0, 20.0, 20.5, 21.0, 21.5, 19.0]
    option = chain_options([0.5], verify, 1.0, 5)[1]
    choice = auto.AutoChoice(1, None, option, [0.5], "v", verify, 1.0, True, False)
    assert choice.rows == 6
    assert shape_rows(choice, 1, "float32") == {"chain_rows": 6, "plain_rows": 1}
    assert shape_rows(choice, 1, "bfloat16") == {"chain_rows": 6, "plain_rows": 6, "fastest_plain_rows": 1}
    assert shape_rows(None, 3, "bfloat16") == {"chain_rows": 4, "plain_rows": 4, "fastest_plain_rows": None}
    assert shape_rows(None, 3, "bfloat16", 2) == {"chain_rows": 4, "plain_rows": 4, "fastest_plain_rows": 2}
    assert shape_rows(None, 3, "bfloat16", 4) == {"chain_rows": 4, "plain_rows": 4, "fastest_plain_rows": None}
    assert shape_rows(None, 3, "float32") == {"chain_rows": None, "plain_rows": None}


def test_plain_decoding_runs_at_the_rows_this_machine_measured_cheapest(target, tiny_target, tmp_path, monkeypatch,
                                                                        capsys):
    """Issue 56: one row runs slower than two on some CPUs (this EPYC: 64.3 vs 40.9 ms/token on SmolLM2), so plain
    decoding's R comes from the verify curve: the one recorded for the model's shapes (-k auto's and plan's
    whole-forward record), measured once where none is, one row where the kernel timing is off. generate --method
    greedy and bench's plain (fixed -k) run at it, with a line; the tokens are plain decoding's at that R."""
    from specdraft import kernels
    from specdraft.infer.generate import generate_one

    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    assert auto.plain_rows(target, 5) == (1, [])                                # the suite: SPECDRAFT_KERNEL_PATH=linear
    monkeypatch.setattr(kernels, "measuring", lambda: True)
    measured = []

    def costs(target_model, drafter, n_max, context, rounds=3, repeats=5, label=""):
        measured.append(n_max)
        ms = {n: {"table": t, "linear": t + 1, "mm": t + 2} for n, t in zip(range(1, n_max + 1), [9.0, 6.0, 7.0, 8.0])}
        kernels.record_whole_forward(kernels.target_linears(target_model), ms)
        return {"verify_ms": [ms[n]["table"] for n in ms], "draft_ms": None}
    monkeypatch.setattr(auto, "measure_costs", costs)
    assert auto.plain_rows(target, 5) == (2, [9.0, 6.0, 7.0, 8.0]) and measured == [4]
    assert auto.plain_rows(target, 5) == (2, [9.0, 6.0, 7.0, 8.0]) and measured == [4]      # recorded: not again
    path = kernels.forward_file(kernels.target_linears(target))
    path.write_text("{not json")                                                # damaged: measured again
    assert auto.plain_rows(target, 5)[0] == 2 and measured == [4, 4]

    monkeypatch.setattr(auto, "plain_rows", lambda model, context: (2, [9.0, 6.0, 7.0, 8.0]))
    from specdraft.infer.sampling import Sampling
    one = dict(prompt="hi", model=tiny_target, drafter=None, method="greedy", k_option=None, stop=None, tree=None,
               sampling=Sampling(), max_new_tokens=6, ngram=(1, 3), device="cpu", dtype="float32",
               trust_remote_code=False, stream=False)
    got, _ = generate_one(**one)
    assert "note: plain decoding at R=2 rows" in capsys.readouterr().err
    at_one, _ = generate_one(**one, rows=1)
    assert "plain decoding at R=" not in capsys.readouterr().err
    assert got["token_ids"] == at_one["token_ids"]          # a tiny fp32 model: the pad row changes no token
    out = tmp_path / "bench.json"
    res = invoke("bench", "--model", tiny_target, "--methods", "greedy,plain,ngram", "-k", "2", "--max-new-tokens",
                 "6", "--limit", "1", "--rounds", "1", "--out", out)
    assert res.exit_code == 0, res.output
    m = json.loads(out.read_text())["methods"]
    assert m["plain"]["rows"] == 2 and m["ngram"]["rows"] == 3 and m["plain"]["identical_to_greedy"]


def test_x_plain_is_against_the_faster_plain_run():
    """Outside float32 plain runs at the chains' R (the tokens' reference) and at its own R: "x plain" takes the
    faster, whichever it is, and the own-R run is kept under plain's `fastest`, not as a method of its own."""
    from specdraft.infer.bench import FASTEST_PLAIN, over_plain
    from specdraft.infer.speculative import Generation

    def run(tps: float) -> list[list[Generation]]:             # one round, one prompt of 10 tokens
        return [[Generation(token_ids=[1] * 10, seconds=10 / tps, target_forwards=10)]]

    for reference_tps, own_tps in ((10.0, 12.5), (12.5, 10.0)):
        results = {"plain": {"tokens_per_s": reference_tps}, "ngram": {"tokens_per_s": 15.0}}
        runs = {"plain": run(reference_tps), FASTEST_PLAIN: run(own_tps)}
        over_plain(results, runs, [[1] * 10], [5.0], 2)
        assert results["plain"]["fastest"]["rows"] == 2
        assert results["plain"]["fastest"]["tokens_per_s"] == pytest.approx(own_tps)
        assert results["plain"]["fastest"]["speedup_over_plain"] == pytest.approx(own_tps / 12.5)
        assert results["plain"]["fastest"]["speedup"] == pytest.approx(own_tps / 5.0)
        assert results["ngram"]["speedup_over_plain"] == pytest.approx(15.0 / 12.5)
        assert set(results) == {"plain", "ngram"}
    results = {"plain": {"tokens_per_s": 10.0}, "ngram": {"tokens_per_s": 15.0}}
    over_plain(results, {"plain": run(10.0)}, [[1] * 10], [5.0], None)          # float32: one plain run
    assert "fastest" not in results["plain"] and results["ngram"]["speedup_over_plain"] == pytest.approx(1.5)


def test_compute_dtype_auto_in_bench_and_the_bf16_reference_is_plain_decoding(tiny_target, tmp_path, monkeypatch):
    """--compute-dtype auto: float32 where timing is off (the suite); where bf16 measures faster, bench runs
    bf16 and adds plain decoding at the chain's R as the lossless reference. There plain slowed to the chain's R
    is no speed baseline: where plain's own R differs, bench runs it there too and "x plain" is against the
    faster (a bf16 bench on the AVX-512 EPYC had plain at R=4, 42 ms a token, where R=2 runs ~37). A bad value
    is one line."""
    from specdraft import dtypes

    out = tmp_path / "bench.json"
    args = ["bench", "--model", tiny_target, "--drafter", "untrained:64", "--methods", "greedy,eagle3", "-k", "2",
            "--max-new-tokens", "6", "--limit", "2", "--rounds", "1", "--compute-dtype", "auto", "--out", out]
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    config = json.loads(out.read_text())["config"]
    assert (config["dtype"], config["dtype_asked"]) == ("float32", "auto")
    monkeypatch.setattr(dtypes, "measuring", lambda: True)
    monkeypatch.setattr(dtypes, "faster_dtype", lambda shapes, rows: ("bfloat16", {"float32": 2.0, "bfloat16": 1.0}))
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["config"]["dtype"] == "bfloat16"
    assert report["methods"]["plain"]["rows"] == report["methods"]["eagle3"]["rows"] == 3
    assert report["methods"]["eagle3"]["identical_to_plain"] is True
    monkeypatch.setattr(auto, "plain_rows", lambda model, context: (2, [9.0, 6.0, 7.0, 8.0]))
    res = invoke(*[a if a != "greedy,eagle3" else "greedy,plain,eagle3" for a in args])
    assert res.exit_code == 0, res.output
    m = json.loads(out.read_text())["methods"]                  # plain twice: the reference and the speed baseline
    assert m["plain"]["rows"] == 3 and m["plain"]["fastest"]["rows"] == 2 and "plain (its own R)" not in m
    baseline = max(m["plain"]["tokens_per_s"], m["plain"]["fastest"]["tokens_per_s"])
    assert m["eagle3"]["speedup_over_plain"] == pytest.approx(m["eagle3"]["tokens_per_s"] / baseline)
    assert "at R=2" in res.stdout                              # the table's row of it ("plain at R=2", wrapped)
    res = invoke("generate", "--model", tiny_target, "--prompt", "hi", "--compute-dtype", "int8")
    assert isinstance(res.exception, SpecdraftError)
    assert str(res.exception) == "--compute-dtype int8: use auto, float32, bfloat16, float16"


def test_why_not_faster_names_the_slower_methods_and_the_costs():
    from specdraft.infer.bench_output import why_not_faster

    report = {"methods": {"greedy": {"speedup": 1.0}, "ngram": {"speedup": 0.89}, "eagle3": {"speedup": 1.2}},
              "config": {"k_auto": {"k": 2, "verify_ms": [50.0, 89.0, 95.0], "draft_ms": 2.5}}}
    line = why_not_faster(report)
    assert line.startswith("ngram was slower than greedy") and "1.78x a 1-token forward" in line and "2.5 ms" in line
    report["methods"]["ngram"]["speedup"] = 1.1
    assert why_not_faster(report) is None
    report["methods"]["eagle3"]["speedup"] = 0.9
    del report["config"]["k_auto"]
    assert "specdraft plan" in why_not_faster(report)


def test_auto_stop_threshold_is_the_marginal_rule():
    rates, verify, draft = [0.8, 0.6, 0.3], [40.0, 42.0, 44.0, 46.0, 48.0], 4.0
    option, threshold = auto.decide(rates, verify, draft, 3, stop_auto=True)
    assert option.k == 3
    value = option.cycle_ms / option.tokens_per_cycle          # ms a token costs at K=3
    assert threshold == pytest.approx(draft / value)
    # a draft pays exactly when confidence * value > one draft step: the round's R rows are paid anyway
    assert (threshold + 1e-6) * value > draft > (threshold - 1e-6) * value
    free = chain_options([0.5], [10.0], 0.0, 2)[2]               # free drafting: never stop
    assert stop_threshold(free, 0.0) == 0.0
    assert stop_threshold(free, 1e9) == 1.0


def test_conditional_and_expected_tokens():
    assert conditional([0.5, 0.25, 0.1]) == pytest.approx([0.5, 0.5, 0.4])
    assert conditional([0.2, 0.4]) == [0.2, 1.0]                  # clamped: a stop changes who is offered
    assert expected_tokens([0.5], 2) == pytest.approx(1.75)


# ----------------------------------------------------------------------------- confidence stop

@pytest.mark.parametrize("stop", [0.0, 0.05, 0.3, 0.6, 0.9, 1.0])
def test_confidence_stop_never_changes_greedy_output(target, drafter, stop):
    rng = random.Random(int(stop * 100))
    cut = 0
    for i in range(4):
        prompt = [rng.randrange(3, 200) for _ in range(rng.randint(4, 16))]
        ref = hf_greedy(target, prompt, 30)
        proposer = EagleProposer(drafter, k=1 + i % 5, stop=stop)
        out = generate(target, prompt, proposer, max_new_tokens=30, eos_token_ids={2})
        assert out.token_ids == ref, (stop, i)
        assert out.drafts_cut == proposer.drafts_cut
        cut += out.drafts_cut
        if stop == 1.0:
            assert sum(out.proposed) == 0           # nothing is ever that sure: plain decoding
    assert (cut == 0) == (stop == 0.0), cut


def test_confidence_stop_with_sampling_runs_and_cuts(target, drafter):
    proposer = EagleProposer(drafter, k=4, stop=0.5)
    out = generate(target, [5, 6, 7, 8], proposer, 24, Sampling(temperature=0.8, seed=1), {2})
    assert len(out.token_ids) == 24 and out.drafts_cut > 0
    with pytest.raises(SpecdraftError, match="--draft-stop 1.5"):
        EagleProposer(drafter, k=4, stop=1.5)


def test_growing_cache_behaves_as_the_concatenating_one():
    g = torch.Generator().manual_seed(0)
    plain, grown = DynamicCache(), GrowingKVCache()
    for n, crop in [(5, None), (1, None), (300, 200), (2, 150), (1, None), (40, 10)]:
        k, v = torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, n, 4, generator=g)
        for a, b in zip(plain.update(k, v, 0), grown.update(k, v)):
            assert torch.equal(a, b)
        if crop is not None:
            plain.crop(crop - plain.get_seq_length()), grown.crop(crop)     # DynamicCache: tokens to drop
        assert plain.get_seq_length() == len(grown) and torch.equal(plain.layers[0].keys, grown.key)


# ----------------------------------------------------------------------------- auto settings

def test_choose_with_warmup_and_checkpoint_metrics(target, drafter, tmp_path, monkeypatch):
    # measured here, end to end: this random drafter is hardly ever accepted, so K=0 (plain) is a fair answer
    choice = auto.choose(target, drafter, None, [5, 6, 7, 8, 9], None, None, stop_auto=True, k_max=4)
    assert 0 <= choice.k <= 4 and "warm-up" in choice.source and len(choice.rates) == 4
    assert len(choice.verify_ms) == 5 and choice.draft_ms > 0 and choice.option.k == choice.k
    assert (choice.stop is None) == (choice.k == 0) and choice.line().startswith(f"-k auto: K={choice.k}")
    # a drafter the warm-up finds good, on costs where drafting pays: a chain, with its stop
    monkeypatch.setattr(auto, "warmup_accept", lambda *a, **k: [0.8, 0.6, 0.4, 0.2])
    monkeypatch.setattr(auto, "measure_costs", lambda *a, **k: {"verify_ms": [2.0, 2.02, 2.04, 2.06, 2.08],
                                                                "draft_ms": 0.01})
    choice = auto.choose(target, drafter, None, [5, 6, 7, 8, 9], None, None, stop_auto=True, k_max=4)
    assert 1 <= choice.k <= 4 and 0.0 <= choice.stop <= 1.0 and "warm-up" in choice.source
    assert choice.option.k == choice.k and "-k auto: K=" in choice.line() and "--draft-stop auto" in choice.line()
    json.dumps(choice.to_dict())
    ckpt = tmp_path / "run" / "best"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "val.json").write_text(json.dumps({"cond_acc_0": 0.6, "cond_acc_1": 0.5}))
    assert auto.checkpoint_accept(tmp_path / "run") == ([0.6, 0.5], str(ckpt / "val.json"))
    (ckpt / "val.json").unlink()
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps(
        {"split": "val", "epoch": 0, "step": 1, "metrics": {"cond_acc_0": 0.7, "cond_acc_1": 0.4}}) + "\n")
    rates, source = auto.checkpoint_accept(ckpt)
    assert rates == [0.7, 0.4] and "metrics.jsonl" in source
    assert auto.checkpoint_accept("untrained:64") is None


def test_positions_the_warm_up_never_reached_are_not_zero_acceptance(target, drafter, monkeypatch, capsys):
    """Issue 36: 38 warm-up rounds, 2 reaching position 3 and none position 4, printed acceptance
    0.00 there (eval measures 0.45). A position reached in fewer than MIN_REACHED rounds is unknown:
    the last measured rate is carried forward, marked ~, and the line says so."""
    accepted = [0] * 20 + [1] * 16 + [2] * 2           # 38 rounds of a 4-draft chain
    rates = auto.rates_from_rounds(accepted, [4] * 38, 4)
    assert rates[0] == pytest.approx(18 / 38) and rates[1] == pytest.approx(2 / 18)
    assert rates[2:] == [None, None]                    # 2 rounds reached position 3: not measured
    monkeypatch.setattr(auto, "warmup_accept", lambda *a, **k: [0.48, 0.47, None, None])
    monkeypatch.setattr(auto, "measure_costs", lambda *a, **k: {"verify_ms": [2.0, 2.02, 2.04, 2.06, 2.08],
                                                                "draft_ms": 0.01})
    choice = auto.choose(target, drafter, None, [5, 6, 7, 8, 9], None, None, stop_auto=False, k_max=4)
    assert choice.rates == [0.48, 0.47, 0.47, 0.47] and choice.measured == 2
    line = choice.line()
    assert "0.48 0.47 0.47~ 0.47~" in line and "0.00" not in line
    assert "positions 3..4 (~) not reached in 5 rounds: position 2's rate carried forward" in line
    # a non-monotonic verify curve is said, as plan says it
    monkeypatch.setattr(auto, "measure_costs", lambda *a, **k: {"verify_ms": [2.0, 3.0, 2.0, 3.1, 3.2],
                                                                "draft_ms": 0.01})
    auto.resolve(type("T", (), {"model": target})(), drafter, None, [5, 6, 7, 8, 9], None, None)
    assert "verify cost is not monotonic" in capsys.readouterr().err


# ----------------------------------------------------------------------------- honest timing

def test_rotation_interleaving_and_warnings(monkeypatch):
    assert [timing.rotated("abc", r) for r in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    calls = []
    timed = timing.interleaved_ms({"x": lambda: calls.append("x"), "y": lambda: calls.append("y")}, 3, 2)
    assert calls == ["x", "y"] + ["x", "x", "y", "y", "y", "y", "x", "x", "x", "x", "y", "y"]
    assert timed["order"] == [["x", "y"], ["y", "x"], ["x", "y"]]
    assert len(timed["samples"]["x"]) == 3 and all(len(s) == 2 for s in timed["samples"]["x"])
    assert set(timed["stats"]["y"]) == {"median", "min", "max"}
    monkeypatch.setattr(timing.os, "cpu_count", lambda: 2)
    assert timing.busy_warning("bench", 1.0, 1.9) is None
    line = timing.busy_warning("bench", 3.5, 1.0)
    assert line.startswith("warning: bench: the machine was busy") and "\n" not in line
    # issue 36: a 2-core bench's own 2 threads are the load (2.04) of a quiet 2-core machine
    assert timing.busy_warning("bench", 0.3, 2.04, own_threads=2) is None
    assert "2 of it this command's own threads" in timing.busy_warning("bench", 0.3, 3.1, own_threads=2)
    assert timing.busy_warning("bench", 2.04, 2.04) is None                       # within the slack
    assert timing.monotonic_warning([10.0, 10.2, 10.1, 11.0]) is None          # within noise
    assert "n=3" in timing.monotonic_warning([10.0, 12.0, 11.0, 13.0])


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("argv,message", [
    (["-k", "0"], "--num-speculative-tokens 0"), (["-k", "x"], "--num-speculative-tokens x"),
    (["--draft-stop", "1.5"], "--draft-stop 1.5"), (["--draft-stop", "often"], "--draft-stop often"),
    (["--rounds", "0"], "--rounds 0")])
def test_bad_values_are_one_line_errors(argv, message):
    res = invoke("bench", "--methods", "greedy,eagle3", "--drafter", "untrained", *argv)
    assert res.exit_code != 0 and isinstance(res.exception, SpecdraftError), res.output
    assert message in str(res.exception) and "\n" not in str(res.exception)
    if argv[0] != "--rounds":
        res = invoke("generate", "--prompt", "hi", "--drafter", "untrained", *argv)
        assert isinstance(res.exception, SpecdraftError) and message in str(res.exception)
    res = invoke("generate", "--prompt", "hi", "--method", "ngram", "-k", "auto")
    from specdraft import families                       # the message lists every registered family's chain

    assert isinstance(res.exception, SpecdraftError)
    assert f"--method {', '.join(families.names())};" in str(res.exception)


def test_options_are_in_help():
    for cmd in ("bench", "generate", "plan"):
        text = invoke(cmd, "--help").output
        assert ("--rounds" in text) == (cmd != "generate")
        if cmd != "plan":
            assert "--draft-stop" in text and "auto" in text


# ----------------------------------------------------------------------------- one-forward families

def test_a_one_forward_family_pays_its_draft_once_per_round():
    """P-EAGLE and DFlash draft K tokens in one forward: cycle(K) = draft + verify(K+1), so a costly
    draft that sinks every EAGLE-3 chain still lets a long parallel round pay."""
    rates, verify, draft = [0.7, 0.6, 0.5, 0.4], [10.0, 10.2, 10.4, 10.6, 10.8], 6.0
    chain = chain_options(rates, verify, draft, 4)
    parallel = chain_options(rates, verify, draft, 4, one_forward=True)
    assert [o.cycle_ms for o in parallel] == pytest.approx([10.0] + [draft + v for v in verify[1:]])
    assert [o.cycle_ms for o in chain] == pytest.approx([k * draft + v for k, v in enumerate(verify)])
    assert auto.decide(rates, verify, draft, None, False, 4)[0].k < auto.decide(rates, verify, draft, None, False, 4,
                                                                                 one_forward=True)[0].k
    assert stop_threshold(parallel[4], draft, one_forward=True) < stop_threshold(parallel[4], draft)


@pytest.mark.parametrize("family", ["peagle", "dflash", "dspark"])
def test_k_auto_times_a_one_forward_round_and_stays_lossless(target, family):
    d = tiny_drafter_for(target, AUX, every=2, seed=1, family=family).eval()
    step = auto.draft_timer(d, context=12, k=3)                 # DFlash's block of 4 drafts at most 3
    step(), step()                                             # repeatable: the context is cropped back each time
    choice = auto.choose(target, d, None, [5, 6, 7, 8, 9], None, None, stop_auto=False, k_max=4)
    assert choice.one_forward and 0 <= choice.k <= (3 if family == "dflash" else 4)   # -k auto stays in the block
    assert ("draft forward" in choice.line()) == (choice.k > 0)
    from specdraft.families import family as family_named

    out = generate(target, [5, 6, 7, 8, 9], family_named(family).proposer(d, k=max(choice.k, 1)), max_new_tokens=12,
                   eos_token_ids={2})
    assert out.token_ids == hf_greedy(target, [5, 6, 7, 8, 9], 12)
    limit = family_named(family).max_draft(d.config)             # DFlash, DSpark: the block's draft slots
    if limit is not None:
        longer = auto.choose(target, d, None, [5, 6, 7, 8, 9], None, None, stop_auto=False, k_max=limit + 3)
        assert longer.k <= limit and len(longer.rates) == limit
