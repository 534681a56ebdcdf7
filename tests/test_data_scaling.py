"""benchmarks/data_scaling.py, the source and lever ablation harness, end to end on the tiny target."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_scaling(tiny_target, tmp_path, *extra):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "data_scaling.py"), "--model", str(tiny_target),
           "--workspace", str(tmp_path / "ws"), "--samples", "4,6", "--max-new-tokens", "8", "--natural-limit", "2",
           "--holdout-limit", "2", "--bench-tokens", "6", "-k", "2", "--vocab-size", "64",
           "--results", str(tmp_path / "results"), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_scaling_points_record_tau_and_stage_times_and_reuse_answers(tiny_target, tmp_path):
    """Two points with --natural-store (eval's τ on a store the later point never trained on; in use the
    natural set's prompts, regenerated and captured) and no benches, each also trained on a second store
    that needs no regeneration (--extra pydoc:3, Python's documentation as answers); then the first
    point again with both benches, everything before them reused."""
    ws = tmp_path / "ws"
    run_scaling(tiny_target, tmp_path, "--set", "epochs=1", "--label", "tiny", "--natural-store", str(ws / "hidden-4"),
                "--natural-limit", "0", "--holdout-limit", "0", "--extra", "pydoc:3")
    report = json.loads((tmp_path / "results" / "data_scaling-tiny.json").read_text())
    assert [p["samples"] for p in report["points"]] == [4, 6] and report["k"] == 2
    assert report["settings"] == ["epochs=1"] and report["conversations"] == "builtin"
    for p in report["points"]:
        assert p["natural"] is None and p["holdout"] is None
        assert {"capture", "train", "eval", "eval_natural"} <= set(p["seconds"]) and "bench_natural" not in p["seconds"]
        assert len(p["eval_tau_by_k"]) == 3 and p["trained_tokens"] > 0
        assert len(p["natural_eval"]["tau_by_k"]) == 3 and p["natural_eval"]["samples"] == 4
        assert p["natural_eval"]["tau_by_k"][0] == 1.0 and len(p["natural_eval"]["cond_acc"]) == 2
    # the second point reused the first point's answers: only the new prompts were regenerated
    data6 = json.loads((ws / "data-6" / "prepare.json").read_text())["regeneration"]
    assert data6["reused"] == 4 and data6["generated"] == 2
    table = (tmp_path / "results" / "data_scaling-tiny.md").read_text()
    row = [line for line in table.splitlines() if line.startswith("| 6 |")]
    assert "| 4 |" in table and row and "| - | - |" in row[0] and "cond" in row[0], table
    assert (tmp_path / "results" / "data_scaling-tiny.png").stat().st_size > 1000
    assert "epochs: 1" in (ws / "runs" / "4-tiny" / "config.yaml").read_text()
    # the extra store: prepared as written (no regeneration), captured once, trained on by every point
    assert report["extra"] == "pydoc:3" and {"prepare_extra", "capture_extra"} <= set(report["points"][0]["seconds"])
    extra = json.loads((ws / "extra-pydoc-3" / "prepare.json").read_text())
    assert extra["counts"]["samples"] == 3 and extra["counts"]["loss_tokens"] > 30 and not extra.get("regeneration")
    for n in (4, 6):
        config = (ws / "runs" / f"{n}-tiny" / "config.yaml").read_text()
        assert str(ws / f"hidden-{n}") in config and str(ws / "extra-pydoc-3-hidden") in config, config

    trained = (ws / "runs" / "4-tiny" / "best" / "config.json").stat().st_mtime_ns
    run_scaling(tiny_target, tmp_path, "--samples", "4", "--set", "epochs=1", "--label", "tiny", "--extra", "pydoc:3",
                "--results", str(tmp_path / "benched"))
    point = json.loads((tmp_path / "benched" / "data_scaling-tiny.json").read_text())["points"][0]
    # nothing before the benches ran again, and the reused stages keep the times they cost
    assert (ws / "runs" / "4-tiny" / "best" / "config.json").stat().st_mtime_ns == trained
    assert {k: v for k, v in point["seconds"].items() if not k.startswith("bench")} == report["points"][0]["seconds"]
    assert {"bench_natural", "bench_holdout"} <= set(point["seconds"])
    for prompts in ("natural", "holdout"):
        assert set(point[prompts]) == {"ngram", "eagle3", "hybrid"}
        for method in point[prompts].values():
            assert method["tau"] >= 1.0 and method["identical_to_greedy"] is True
    # n-gram and hybrid drafted from the point's answers too, as in the recipes
    assert json.loads((ws / "runs" / "4-tiny" / "bench_natural.json").read_text())["config"]["datastore"]["path"] == \
        str(ws / "data-4")
    # sampled answers are other data: their own folders, never the greedy point's answers reused
    run_scaling(tiny_target, tmp_path, "--samples", "4", "--set", "epochs=1", "--label", "sampled", "--temperature",
                "0.8", "--natural-limit", "0", "--holdout-limit", "0", "--results", str(tmp_path / "sampled"))
    assert json.loads((tmp_path / "sampled" / "data_scaling-sampled.json").read_text())["temperature"] == 0.8
    sampled = json.loads((ws / "data-4-t0.8" / "prepare.json").read_text())["regeneration"]
    assert sampled["reused"] == 0 and sampled["generated"] == 4 and (ws / "hidden-4-t0.8" / "manifest.json").is_file()


def test_long_context_benchmark_on_the_tiny_target(tiny_target, tmp_path):
    """benchmarks/long_context.py (issue 38) at toy size: train RSS and tok/s per row length, τ by
    context bucket of two drafters on the long prompt set."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "long_context.py"), "--model", str(tiny_target),
           "--rows", "64,256", "--steps", "2", "--sliding-window", "32", "--drafters", "untrained:64,untrained:32",
           "--limit", "2", "--max-context", "600", "--bench-tokens", "6", "-k", "2", "--label", "tiny",
           "--results", str(tmp_path / "results")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "long_context-tiny.json").read_text())
    assert [r["row_tokens"] for r in report["train"]] == [64, 256]
    for r in report["train"]:
        assert r["peak_rss_mb"] > 50 and r["train_tok_per_s"] > 0 and r["sliding_window"] == 32 and r["loss"] > 0
    assert [b["drafter"] for b in report["bench"]] == ["untrained:64", "untrained:32"]
    for b in report["bench"]:
        rounds = [x["rounds"] for x in b["by_context"]["buckets"].values()]
        assert b["k"] == 2 and b["identical_to_greedy"] is True and sum(rounds) > 0
    table = (tmp_path / "results" / "long_context-tiny.md").read_text()
    assert "| 256 |" in table and "untrained:32" in table and "rounds" in table


def test_ngram_datastore_replay_gives_bench_tau_without_the_target(tmp_path):
    """benchmarks/ngram_datastore.py replays n-gram over answers the target wrote: τ per round as a bench
    counts it, with and without a datastore; a datastore holding the answers lifts it."""
    from specdraft.data.prepared import save_prepared

    answer = [50 + (i * 7) % 31 for i in range(40)]          # a greedy answer that repeats little
    rows = {"input_ids": [[1, 2, 3] + answer], "loss_mask": [[0, 0, 0] + [1] * 40], "messages": ["[]"]}
    save_prepared(tmp_path / "natural", rows, {"source": "test"})
    save_prepared(tmp_path / "train", {**rows, "input_ids": [[9, 9, 9] + answer]}, {"source": "test"})
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ngram_datastore.py"), "--natural",
                           str(tmp_path / "natural"), "--datastore", f"train={tmp_path / 'train'}", "-k", "3",
                           "--results", str(tmp_path / "results")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "results" / "ngram_datastore.json").read_text())["rows"]
    whole = {r["datastore"]: r for r in rows if r["prompts"].startswith("all 1 prompts")}
    plain, stored = whole["none (the context only)"], whole["train"]
    assert stored["tokens"] == 40 and stored["tau"] > plain["tau"] + 1 and stored["tau"] <= 4
    # the replay's rounds: 40 tokens in rounds of at most K + 1
    assert stored["rounds"] >= 10 and plain["rounds"] * plain["tau"] == pytest.approx(40)
    assert "| train | 40 |" in (tmp_path / "results" / "ngram_datastore.md").read_text()
