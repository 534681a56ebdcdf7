"""The README's pipeline on a tiny target of each architecture users bring (testing.TINY_ARCHS), in
process, and the support table docs/targets.md is made of (scripts/targets_table.py writes it from
these results; tests/test_architectures.py checks the committed file is what they give)."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

from test_readme_pipeline import readme_commands, scaled

STAGES = ("info", "prepare", "capture", "vocab", "train", "eval", "bench", "export speculators", "export sglang")
NOT_IN_SUITE = "vLLM-CPU (regeneration, capture, serving)"
# What tests/test_vllm_archs.py (and test_vllm_engine.py, test_recipes.py on Llama) prove in vLLM-CPU 0.32.
VLLM_TESTED = {
    "llama": "✔ (test_vllm_engine.py, the recipe's vLLM test)",
    "qwen3": "✔ (test_vllm_archs.py: answers equal, states within 1e-3, served eagle3 = plain)",
    "qwen3_moe": "✔ (test_vllm_archs.py: answers equal, states within 1e-3, served eagle3 = plain)",
    "gpt_oss": "✔ (test_vllm_archs.py: answers equal, states within 1e-3 past the window, served eagle3 = plain)",
    "deepseek_v3": "✔ served eagle3 = plain with VLLM_MLA_DISABLE=1 (CPU MLA and EAGLE-3 share no KV block "
                   "size); states differ 0.6-1.1% from transformers' (test_vllm_archs.py)",
    **dict.fromkeys(("qwen2_5_vl", "llama4"), "not run here: vLLM imports torchvision for this vision-language class "
                    "(No module named 'torchvision'), which this CPU environment leaves out"),
    "kimi_k25": "not run here: vLLM's class needs the checkpoint's image processor (preprocessor_config.json)",
}


def invoke(argv: list[str], cwd: Path) -> tuple[int, str]:
    import os

    from typer.testing import CliRunner

    from specdraft.cli import app

    here = os.getcwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, argv)
    finally:
        os.chdir(here)
    from specdraft.errors import SpecdraftError

    text = (res.stdout or "") + (getattr(res, "stderr", "") or "")
    if isinstance(res.exception, SpecdraftError):       # what main() (flags.run_cli) prints, with exit 2
        return 2, text + f"\nerror: {res.exception}"
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        text += f"\n{type(res.exception).__name__}: {res.exception}"
    return res.exit_code, text


def stage_commands(target: Path) -> list[tuple[str, list[str]]]:
    """(stage, argv) in the README's order, scaled as test_readme_pipeline scales them."""
    out = []
    for argv in readme_commands():
        stage = argv[1]
        if stage in ("generate", "doctor", "report"):
            continue
        if stage == "info":
            out.append(("info", ["info", "--model", str(target)]))
            continue
        args = scaled(argv, target)
        if stage == "export":
            out.append(("export speculators", args))
            sglang = list(args)
            sglang[sglang.index("--format") + 1] = "sglang"
            sglang[sglang.index("--out") + 1] = "ws/export/sglang"
            out.append(("export sglang", sglang))
        else:
            out.append((stage, args))
    return out


@functools.cache
def pipeline_result(arch: str) -> dict:
    """{stage: "ok" or the first line of why not} for `arch`, plus what the bench compared."""
    from specdraft.testing import save_tiny_arch

    work = Path(tempfile.mkdtemp(prefix=f"arch-{arch}-"))
    target = save_tiny_arch(work / "target", arch)
    result: dict = {}
    for stage, argv in stage_commands(target):
        code, text = invoke(argv, work)
        if code != 0:
            lines = [l for l in text.splitlines() if l.strip()]
            result[stage] = (lines[-1] if lines else f"exit {code}")[:160]
            break
        result[stage] = "ok"
        if stage == "bench":
            bench = json.loads((work / "ws/runs/a/bench.json").read_text())
            result["bench identical"] = all(m["identical_to_greedy"] for m in bench["methods"].values())
    result["work"] = str(work)
    return result


def support_table(results: dict[str, dict]) -> str:
    """The markdown table: architecture x stage, ✔ or the one line that stopped it."""
    from specdraft import adapter
    from specdraft.testing import tiny_arch_config

    head = ["architecture (tiny config)", "layers' attention", *STAGES, NOT_IN_SUITE]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arch, r in results.items():
        cfg = tiny_arch_config(arch, vocab_size=263)
        types = sorted(set(adapter.layer_types(cfg)))
        kind = ", ".join(t.replace("_attention", "") for t in types) + (" + MLA" if adapter.mla(cfg) else "") \
            + (" + MoE" if adapter.moe(cfg) else "")
        cells = []
        for stage in STAGES:
            value = r.get(stage)
            if stage == "bench" and value == "ok":
                value = "ok" if r.get("bench identical") else "outputs differ from greedy"
            cells.append("✔" if value == "ok" else (value or "not reached").replace("|", "/"))
        serve = VLLM_TESTED.get(arch) or ("not run by the suite" if adapter.architecture(cfg).vllm_serves_drafters
                                          else "vLLM 0.32 serves no EAGLE-3 drafter for it")
        text = adapter.text_config(cfg).model_type
        name = arch if text == cfg.model_type else f"{arch} (wrapping {text})"
        lines.append(f"| {name} | {kind} | " + " | ".join(cells) + f" | {serve} |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- table: scripts/targets_table.py -->", "<!-- end of table -->"


def doc_table(doc: str) -> str:
    return doc[doc.index(BEGIN) + len(BEGIN):doc.index(END)].strip() + "\n"
