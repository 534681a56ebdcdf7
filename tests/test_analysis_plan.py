"""plan: the throughput math, acceptance sources and a latency measurement on a tiny target;
probe --drafter: acceptance of a drafter as it is, on the fly vs from a captured store."""

from __future__ import annotations

import json

import pytest
import torch

from specdraft import journal
from specdraft.analysis import plan, probe
from specdraft.errors import SpecdraftError


def test_expected_tokens_formula():
    assert plan.expected_tokens([0.8, 0.5], 0) == 1.0
    assert plan.expected_tokens([0.8, 0.5], 1) == pytest.approx(1.8)
    assert plan.expected_tokens([0.8, 0.5], 2) == pytest.approx(1 + 0.8 + 0.4)
    assert plan.expected_tokens([0.8, 0.5], 3) == pytest.approx(1 + 0.8 + 0.4 + 0.2)   # last rate repeats
    assert plan.expected_tokens([1.0], 5) == 6.0
    assert plan.expected_tokens([], 3) == 1.0


def test_chain_options_flat_vs_growing_verify():
    rates = [0.8, 0.7, 0.6, 0.5]
    # 8-GPU tensor-parallel verify: ~30 ms whatever n (25 ms of it all-reduce), draft 2 ms
    flat = plan.chain_options(rates, [30.0], 2.0, 8)
    o3 = flat[3]
    assert o3.tokens_per_cycle == pytest.approx(1 + 0.8 + 0.56 + 0.336)
    assert o3.cycle_ms == pytest.approx(3 * 2.0 + 30.0)
    assert o3.tokens_per_s == pytest.approx(1000 * o3.tokens_per_cycle / 36.0)
    assert o3.speedup == pytest.approx(o3.tokens_per_s / (1000 / 30.0))
    assert o3.draft_share == pytest.approx(6 / 36) and o3.verify_share == pytest.approx(30 / 36)
    best = max(flat, key=lambda o: o.tokens_per_s)
    assert best.k >= 3
    # verify cost linear in n (a CPU): drafting never pays off
    growing = plan.chain_options(rates, [10.0 * n for n in range(1, 10)], 0.5, 8)
    assert max(growing, key=lambda o: o.tokens_per_s).k == 0
    with pytest.raises(SpecdraftError, match="verify"):
        plan.chain_options(rates, [0.0], 1.0, 4)
    with pytest.raises(SpecdraftError, match=r"\[0, 1\]"):
        plan.chain_options([1.5], [10.0], 1.0, 4)


def test_acceptance_sources(tmp_path):
    assert plan.load_accept("0.8,0.5")[0] == [0.8, 0.5]
    (tmp_path / "bench.json").write_text(json.dumps({"eagle": {}, "per_position_accept": [0.8, 0.4, 0.1]}))
    assert plan.load_accept(str(tmp_path / "bench.json"))[0] == pytest.approx([0.8, 0.5, 0.25])
    (tmp_path / "eval.json").write_text(json.dumps({"metrics": {"cond_acc_1": 0.5, "cond_acc_0": 0.9,
                                                                "accept_len": 2.3}}))
    assert plan.load_accept(str(tmp_path / "eval.json"))[0] == [0.9, 0.5]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"split": "val", "epoch": 0, "tokens_seen": 1, "cond_acc_0": 0.5, "cond_acc_1": 0.2}) + "\n"
        + json.dumps({"split": "val", "epoch": 1, "tokens_seen": 2, "cond_acc_0": 0.7, "cond_acc_1": 0.4}) + "\n"
        + json.dumps({"split": "train", "epoch": 1, "tokens_seen": 3, "cond_acc_0": 0.1}) + "\n")
    assert plan.load_accept(str(run))[0] == [0.7, 0.4]
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(SpecdraftError, match="no per-position acceptance"):
        plan.load_accept(str(tmp_path / "other.json"))
    with pytest.raises(SpecdraftError, match="neither a file"):
        plan.load_accept("fast")


def test_cli_plan_with_given_latencies_writes_json_and_journal(tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    run = tmp_path / "run"
    run.mkdir()                                 # --run names an existing run (issue 57: a typo made one)
    res = CliRunner().invoke(app, ["plan", "--accept", "0.8,0.7,0.6", "--verify-ms", "30", "--draft-ms", "2",
                                   "--max-k", "6", "--run", str(run)])
    assert res.exit_code == 0, res.output
    assert "<- best" in res.output
    saved = json.loads((run / "plan.json").read_text())
    assert len(saved["options"]) == 7 and saved["verify_ms"] == [30.0] * 7
    assert saved["best"]["k"] == max(saved["options"], key=lambda o: o["tokens_per_s"])["k"]
    assert journal.read(run)[0].source == "plan"
    res = CliRunner().invoke(app, ["plan", "--accept", "0.8", "--verify-ms", "30"])
    assert isinstance(res.exception, SpecdraftError) and "--draft-ms" in str(res.exception)


# ----------------------------------------------------------------------------- needs a drafter

@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, tiny_target):
    from transformers import AutoModelForCausalLM

    from specdraft.model.eagle3.config import DrafterConfig
    from specdraft.formats.checkpoints import save_drafter
    from specdraft.model.eagle3.module import Eagle3Drafter
    from specdraft.vocab import mapping_from_counts

    import numpy as np

    target = AutoModelForCausalLM.from_pretrained(tiny_target)
    d2t, t2d = mapping_from_counts(np.arange(263)[::-1].copy(), 96)
    cfg = DrafterConfig.from_target(target.config, draft_vocab_size=96, aux_layer_ids=[2, 4, 5],
                                    verifier=str(tiny_target))
    torch.manual_seed(0)
    net = Eagle3Drafter(cfg)
    net.init_from_target(target, d2t, t2d)
    out = tmp_path_factory.mktemp("drafter") / "d"
    save_drafter(net, out)
    return out


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from specdraft.data.prepared import save_prepared

    g = torch.Generator().manual_seed(3)
    out = tmp_path_factory.mktemp("data") / "data"
    rows = {"input_ids": [], "loss_mask": [], "messages": []}
    for n in (30, 48, 25):
        rows["input_ids"].append(torch.randint(7, 263, (n,), generator=g).tolist())
        rows["loss_mask"].append([0] * 5 + [1] * (n - 5))
        rows["messages"].append("[]")
    save_prepared(out, rows, {"target": {}})
    return out


def test_probe_drafter_on_the_fly_matches_captured_store(tmp_path, tiny_target, drafter_dir, prepared):
    from specdraft.data.capture import capture

    r = probe.probe_drafter(drafter_dir, str(tiny_target), prepared, samples=3, steps=3)
    m = r["metrics"]
    assert set(f"cond_acc_{k}" for k in range(3)) <= set(m) and 1.0 <= m["accept_len"] <= 4.0
    assert m["accept_len"] == pytest.approx(1 + m["cond_acc_0"] + m["cond_acc_0"] * m["cond_acc_1"]
                                            + m["cond_acc_0"] * m["cond_acc_1"] * m["cond_acc_2"])
    assert "simulated τ" in r["verdict"]
    store = tmp_path / "hidden"
    capture(model=str(tiny_target), data=prepared, out=store, dtype="float32", progress=False)
    rates = plan.accept_from_store(drafter_dir, str(tiny_target), store, steps=3)
    # every metric (losses too, which are never trivially 0) agrees with the captured store
    from transformers import AutoModelForCausalLM

    from specdraft.data.store import HiddenStore
    from specdraft.formats.checkpoints import load_drafter

    hs = HiddenStore(store)
    batches = [probe.sample_batch(s["input_ids"], s["aux"], s["last"], s["loss_mask"]) for s in hs]
    stored = probe.drafter_metrics(load_drafter(drafter_dir), AutoModelForCausalLM.from_pretrained(tiny_target),
                                   batches, 3)
    assert stored["loss_0"] > 0.1
    for k, v in m.items():
        assert stored[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert rates == pytest.approx([m["cond_acc_0"], m["cond_acc_1"], m["cond_acc_2"]], abs=1e-6)
    text = probe.format_result(r)
    assert "step 0:" in text and "verdict:" in text


def test_plan_measures_latencies_on_tiny_target(tmp_path, tiny_target, drafter_dir):
    result = plan.run(drafter=drafter_dir, model=str(tiny_target), accept="0.6,0.5", k_max=2, context=16,
                      out=tmp_path / "plan.json")
    assert len(result["verify_ms"]) == 3 and all(v > 0 for v in result["verify_ms"])
    assert result["draft_ms"] > 0 and set(result["measured"]) == {"verify", "draft"}
    assert json.loads((tmp_path / "plan.json").read_text())["best"] == result["best"]
    header = next(line for line in plan.format_plan(result).splitlines() if "cycle ms" in line)
    assert header.split()[:2] == ["K", "τ"], header                  # tokens per target forward, named τ
    # interleaved rounds (3 by default): verify(n) and the draft step each round, order rotated, the
    # per-round samples and the spread kept; the plan ranks the medians
    timing = result["timing"]
    assert timing["rounds"] == 3 and len(timing["order"]) == 3 and len({tuple(o) for o in timing["order"]}) == 3
    assert set(timing["samples"]) == {"verify_1", "verify_2", "verify_3", "draft"}
    assert all(len(rounds) == 3 for rounds in timing["samples"].values())
    assert result["verify_ms"][0] == timing["stats"]["verify_1"]["median"] and result["draft_ms"] == timing["draft_ms"]
    assert isinstance(result["warnings"], list) and "interleaved rounds" in plan.format_plan(result)
    # the weight-streaming floor (issue 35): bytes / copy bandwidth, each verify read as a multiple of it
    floor = timing["floor"]
    assert floor["floor_ms"] == pytest.approx(floor["weight_mb"] / floor["bandwidth_gbs"]) and floor["floor_ms"] > 0
    line = next(line for line in plan.format_plan(result).splitlines() if line.startswith("floor:"))
    assert f"verify 1..3 = {result['verify_ms'][0] / floor['floor_ms']:.1f} " in line, line
    with pytest.raises(SpecdraftError, match="--rounds 0"):
        plan.run(drafter=drafter_dir, model=str(tiny_target), accept="0.6", k_max=2, rounds=0)


def test_rates_from_a_bench_json():
    from specdraft.analysis.plan import cond_rates_from

    bench = {"methods": {"greedy": {"per_position_accept": []},
                         "eagle3": {"per_position_accept": [0.5, 0.25, 0.1]}}}
    assert cond_rates_from(bench) == [0.5, 0.5, 0.4]


def test_plan_of_a_run_reads_the_acceptance_the_run_recorded(tmp_path, drafter_dir):
    """Issue 36: plan --drafter RUN refused without --accept although the run held eval.json."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(drafter_dir, run / "best")
    (run / "config.yaml").write_text("ttt_steps: 2\n")
    (run / "eval.json").write_text(json.dumps({"cond_acc": [0.7, 0.5], "accept_len": 2.05}))
    result = plan.run(drafter=run, verify_ms=[30.0], draft_ms=2.0, k_max=3)
    assert result["accept"]["cond_acc"][:2] == [0.7, 0.5] and "eval.json" in result["accept"]["source"]
    (run / "eval.json").unlink()
    (run / "metrics.jsonl").write_text(json.dumps({"split": "val", "epoch": 0, "step": 1,
                                                   "metrics": {"cond_acc_0": 0.6, "cond_acc_1": 0.4}}) + "\n")
    result = plan.run(drafter=run, verify_ms=[30.0], draft_ms=2.0, k_max=3)
    assert result["accept"]["cond_acc"][:2] == [0.6, 0.4] and "metrics.jsonl" in result["accept"]["source"]
