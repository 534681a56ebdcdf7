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
from specdraft.infer.eagle import EagleProposer, GrowingKVCache
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import generate
from specdraft.model.drafter import KVCache
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
    """Independent of costmodel: throughput of every K >= 1 written out, the best (shortest on ties)."""
    best = None
    for k in range(1, k_max + 1):
        tokens, prod = 1.0, 1.0
        for j in range(k):
            prod *= rates[min(j, len(rates) - 1)]
            tokens += prod
        cycle = k * draft_ms + verify_ms[min(k, len(verify_ms) - 1)]
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


def test_auto_stop_threshold_is_the_marginal_rule():
    rates, verify, draft = [0.8, 0.6, 0.3], [40.0, 42.0, 44.0, 46.0, 48.0], 4.0
    option, threshold = auto.decide(rates, verify, draft, 3, stop_auto=True)
    assert option.k == 3
    value = option.cycle_ms / option.tokens_per_cycle          # ms a token costs at K=3
    assert threshold == pytest.approx((draft + 2.0) / value)
    # a draft pays exactly when confidence * value > draft step + one verify row
    assert (threshold + 1e-6) * value > draft + 2.0 > (threshold - 1e-6) * value
    free = chain_options([0.5], [10.0], 0.0, 2)[2]               # free drafting, flat verify: never stop
    assert stop_threshold(free, [10.0], 0.0) == 0.0
    assert stop_threshold(free, [10.0], 1e9) == 1.0


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
    plain, grown = KVCache(), GrowingKVCache()
    for n, crop in [(5, None), (1, None), (300, 200), (2, 150), (1, None), (40, 10)]:
        k, v = torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, n, 4, generator=g)
        for a, b in zip(plain.append(k, v), grown.append(k, v)):
            assert torch.equal(a, b)
        if crop is not None:
            plain.crop(crop), grown.crop(crop)
        assert len(plain) == len(grown) and torch.equal(plain.key, grown.key)


# ----------------------------------------------------------------------------- auto settings

def test_choose_with_warmup_and_checkpoint_metrics(target, drafter, tmp_path):
    choice = auto.choose(target, drafter, None, [5, 6, 7, 8, 9], None, None, stop_auto=True, k_max=4)
    assert 1 <= choice.k <= 4 and 0.0 <= choice.stop <= 1.0 and "warm-up" in choice.source
    assert len(choice.rates) == 4 and len(choice.verify_ms) == 5 and choice.draft_ms > 0
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
    assert isinstance(res.exception, SpecdraftError) and "--method eagle3" in str(res.exception)


def test_options_are_in_help():
    for cmd in ("bench", "generate", "plan"):
        text = invoke(cmd, "--help").output
        assert ("--rounds" in text) == (cmd != "generate")
        if cmd != "plan":
            assert "--draft-stop" in text and "auto" in text
