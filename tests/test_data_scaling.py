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
