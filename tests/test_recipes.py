"""The recipe end to end on the tiny target: every stage's output, the summary, and resume."""

import json

import pytest

from specdraft.errors import SpecdraftError
from specdraft.recipes import Profile, profile_by_name, run_recipe

TINY = Profile(samples=6, max_new_tokens=12, regen_batch=3, draft_vocab=64, ttt_steps=2, epochs=1, lr=1e-3,
               max_tokens=256, warmup_steps=1, bench_prompts=2, bench_tokens=10, k=2)


def test_recipe_runs_every_stage_and_resumes(tiny_target, tmp_path):
    ws = tmp_path / "ws"
    summary = run_recipe(str(tiny_target), ws, profile=TINY)

    run = ws / "runs" / "custom"
    assert json.loads((ws / "data" / "prepare.json").read_text())["regenerate"] is True
    assert json.loads((ws / "hidden" / "manifest.json").read_text())["complete"] is True
    for path in (ws / "vocab.safetensors", run / "best" / "model.safetensors", run / "eval.json",
                 ws / "export" / "speculators" / "config.json", ws / "report.html"):
        assert path.exists(), path
    bench = json.loads((run / "bench.json").read_text())
    assert set(bench["methods"]) == {"greedy", "ngram", "eagle3"}
    # the summary is the bench's numbers, and every method reproduced greedy exactly
    assert summary["identical_to_greedy"] == {"greedy": True, "ngram": True, "eagle3": True}
    assert summary["accept_len"] == bench["methods"]["eagle3"]["accept_len"] >= 1.0
    assert summary["tokens_per_s"]["eagle3"] == bench["methods"]["eagle3"]["tokens_per_s"] > 0
    log = (ws / "recipe.log").read_text()
    stages = [line.split()[2] for line in log.splitlines() if line.startswith("$ specdraft")]
    assert stages == ["prepare", "capture", "vocab", "train", "eval", "bench", "export", "report"]
    assert log.count("exit 0") == 8
    assert "--train-on-prompts" in log and "train_on_prompts: true" in (run / "config.yaml").read_text()

    # a second run skips the finished data, store, vocab and training stages
    run_recipe(str(tiny_target), ws, profile=TINY)
    log = (ws / "recipe.log").read_text()
    stages = [line.split()[2] for line in log.splitlines() if line.startswith("$ specdraft")]
    assert stages[8:] == ["eval", "bench", "export", "report"]


def test_unknown_profile_is_refused():
    with pytest.raises(SpecdraftError, match="--profile huge"):
        profile_by_name("huge")


@pytest.mark.integration
def test_recipe_through_the_vllm_engine(tmp_path):
    """The same recipe with regeneration and capture in vLLM (a tiny Llama whose head size vLLM's CPU
    attention takes): every stage runs, and the data and store record the engine."""
    from specdraft.testing import save_tiny_target

    target = save_tiny_target(tmp_path / "target", hidden_size=64, num_heads=2, num_kv_heads=1)
    ws = tmp_path / "ws"
    summary = run_recipe(str(target), ws, profile=TINY, engine="vllm")
    assert json.loads((ws / "data" / "prepare.json").read_text())["regeneration"]["engine"]["name"] == "vllm"
    assert json.loads((ws / "hidden" / "manifest.json").read_text())["engine"]["name"] == "vllm"
    assert summary["identical_to_greedy"] == {"greedy": True, "ngram": True, "eagle3": True}
    assert "--engine vllm" in (ws / "recipe.log").read_text()
