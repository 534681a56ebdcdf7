"""benchmarks/data_scaling.py, the source and lever ablation harness, end to end on the tiny target."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_scaling(tiny_target, tmp_path, *extra):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "data_scaling.py"), "--model", str(tiny_target),
           "--workspace", str(tmp_path / "ws"), "--samples", "4,6", "--max-new-tokens", "8", "--natural-limit", "2",
           "--holdout-limit", "2", "--bench-tokens", "6", "-k", "2", "--vocab-size", "64",
           "--results", str(tmp_path / "results"), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_scaling_points_record_tau_on_both_prompt_sets_and_stage_times(tiny_target, tmp_path):
    run_scaling(tiny_target, tmp_path, "--set", "epochs=1", "--label", "tiny")   # the lever/source harness
    report = json.loads((tmp_path / "results" / "data_scaling-tiny.json").read_text())
    assert [p["samples"] for p in report["points"]] == [4, 6] and report["k"] == 2
    assert report["settings"] == ["epochs=1"] and report["conversations"] == "builtin"
    for p in report["points"]:
        for prompts in ("natural", "holdout"):
            assert set(p[prompts]) == {"ngram", "eagle3", "hybrid"}
            for method in p[prompts].values():
                assert method["tau"] >= 1.0 and method["identical_to_greedy"] is True
        assert {"capture", "train", "eval", "bench_natural", "bench_holdout"} <= set(p["seconds"])
        assert len(p["eval_tau_by_k"]) == 3 and p["trained_tokens"] > 0
    # the second point reused the first point's answers: only the new prompts were regenerated
    data8 = json.loads((tmp_path / "ws" / "data-6" / "prepare.json").read_text())["regeneration"]
    assert data8["reused"] == 4 and data8["generated"] == 2
    table = (tmp_path / "results" / "data_scaling-tiny.md").read_text()
    assert "| 4 |" in table and "| 6 |" in table and "natural" in table
    assert (tmp_path / "results" / "data_scaling-tiny.png").stat().st_size > 1000
    assert "epochs: 1" in (tmp_path / "ws" / "runs" / "4-tiny" / "config.yaml").read_text()


def test_natural_store_gives_eval_tau_without_benches(tiny_target, tmp_path):
    """--natural-store: eval's τ on a store the run never trained on (in use: the natural set's prompts,
    regenerated and captured), in seconds; --natural-limit 0 / --holdout-limit 0 skip both benches."""
    run_scaling(tiny_target, tmp_path, "--samples", "4", "--set", "epochs=1", "--label", "first")
    run_scaling(tiny_target, tmp_path, "--samples", "6", "--set", "epochs=1", "--label", "nat",
                "--natural-store", str(tmp_path / "ws" / "hidden-4"), "--natural-limit", "0", "--holdout-limit", "0")
    point = json.loads((tmp_path / "results" / "data_scaling-nat.json").read_text())["points"][0]
    assert point["natural"] is None and point["holdout"] is None
    assert len(point["natural_eval"]["tau_by_k"]) == 3 and point["natural_eval"]["samples"] == 4
    assert point["natural_eval"]["tau_by_k"][0] == 1.0 and len(point["natural_eval"]["cond_acc"]) == 2
    assert "eval_natural" in point["seconds"] and "bench_natural" not in point["seconds"]
    row = [line for line in (tmp_path / "results" / "data_scaling-nat.md").read_text().splitlines() if line.startswith("| 6 |")]
    assert row and "| - | - |" in row[0] and "cond" in row[0], row
