"""τ per thinking mode and per part (issue 55), on tiny random targets with the tests' real-format templates.

    .venv/bin/python benchmarks/thinking_modes.py [--samples 48] [--epochs 4]

Per template style (Qwen3-style think tags on a tiny Qwen3, Kimi-style on a tiny Kimi-K2.5, harmony on a tiny
gpt-oss; testing.QWEN3_THINK, KIMI_THINK, HARMONY): prepare --samples builtin prompts regenerated in one setting of
the template's arguments, capture, vocab, train, eval on the held-out store, then bench (greedy and eagle3 at K=3,
6 builtin-holdout prompts x 64 tokens, one round) in that setting and in another, and on 6 natural prompts in the
training setting, and doctor. Each is the CLI as a
user runs it, in process. Recorded: eval's τ by part, each bench's mode, τ and τ by part (reasoning, answer) with
their rounds, and whether doctor's thinking_mode holds.

What the numbers are: random targets never write </think> or a channel token by themselves, so a Kimi-style
prompt (which opens <think>) drafts reasoning only and the others the answer only; the split on real-format answers
is tests/test_thinking.py's. They show the mechanism, not the acceptance of any real model.

Writes benchmarks/results/thinking_modes.json and a Markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

CASES = [("qwen3", "qwen3-think", {}, {"enable_thinking": False}),
         ("kimi_k25", "kimi-think", {}, {"thinking": False}),
         ("gpt_oss", "harmony", {"reasoning_effort": "low"}, {"reasoning_effort": "high"})]


def run(argv: list[str], work: Path) -> str:
    from arch_pipeline import invoke

    code, text = invoke(argv, work)
    if code != 0:
        raise SystemExit(f"{argv[0]} failed (exit {code}): {text[-800:]}")
    return text


def one_case(arch: str, template: str, trained: dict, other: dict, samples: int, epochs: int) -> dict:
    from specdraft.testing import save_tiny_arch

    work = Path(tempfile.mkdtemp(prefix=f"thinking-{template}-"))
    target = str(save_tiny_arch(work / "target", arch, template=template))
    kwargs = ["--chat-template-kwargs", json.dumps(trained)]
    for argv in (["prepare", "--model", target, "--conversations", "builtin", "--regenerate", "--limit", str(samples),
                  "--max-new-tokens", "64", "--batch-size", "16", "--out", "ws/data", *kwargs],
                 ["capture", "--model", target, "--prepared", "ws/data", "--out", "ws/hidden", "--store-dtype", "float32"],
                 ["vocab", "build", "--prepared", "ws/data", "--size", "256", "--out", "ws/vocab.safetensors"],
                 ["train", "--model", target, "--store", "ws/hidden", "--vocab", "ws/vocab.safetensors", "--out",
                  "ws/runs/a", "--epochs", str(epochs), "--max-tokens", "512", "--precision", "fp32", "--lr", "3e-3"],
                 ["eval", "--model", target, "--drafter", "ws/runs/a", "--store", "ws/hidden", "--out",
                  "ws/runs/a/eval.json"]):
        run(argv, work)
    benches = []
    for setting, name, prompts in ((trained, "bench.json", "builtin-holdout"), (other, "bench_other.json",
                                                                                 "builtin-holdout"),
                                   (trained, "bench_natural.json", "natural")):
        run(["bench", "--model", target, "--drafter", "ws/runs/a", "--methods", "greedy,eagle3", "--limit", "6",
             "--prompts", prompts, "--max-new-tokens", "64", "--rounds", "1", "-k", "3", "--out", f"ws/runs/a/{name}",
             "--chat-template-kwargs", json.dumps(setting)], work)
        report = json.loads((work / "ws/runs/a" / name).read_text())
        eagle = report["methods"]["eagle3"]
        benches.append({"prompts_set": prompts, "chat_template_kwargs": setting,
                        "mode": report["config"]["thinking"]["mode"],
                        "tau": eagle["accept_len"], "k": report["config"]["k"],
                        "prompts": report["config"]["num_prompts"], "identical_to_greedy": eagle["identical_to_greedy"],
                        "tau_by_part": eagle["tau_by_part"]})
    run(["doctor", "ws/runs/a", "--model", target], work)
    diagnosis = json.loads((work / "ws/runs/a/doctor.json").read_text())
    evaluated = json.loads((work / "ws/runs/a/eval.json").read_text())
    return {"arch": arch, "template": template, "trained_kwargs": trained, "trained_mode": evaluated["thinking"]["mode"],
            "eval": {"tau": evaluated["accept_len"], "k": evaluated["k"], "samples": evaluated["samples"],
                     "tau_by_part": evaluated["tau_by_part"]},
            "benches": benches, "doctor_thinking_mode_holds": any(c["id"] == "thinking_mode" for c in diagnosis["causes"])}


def part_text(parts: dict, unit: str) -> str:
    return " · ".join(f"{name} {v['tau']:.2f} ({v[unit]} {unit})" if v.get("tau") is not None else f"{name} – (0)"
                      for name, v in parts.items())


def table(results: list[dict], cpu: str) -> str:
    lines = [f"# τ per thinking mode (tiny random targets, {cpu})", "",
             "| target / template | trained with | eval τ at K=3 by part (held-out store) | bench with (mode) | "
             "bench τ at K=3 on 6 prompts of | by part | = greedy |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for i, b in enumerate(r["benches"]):
            head = (f"| {r['arch']} / {r['template']} | `{json.dumps(r['trained_kwargs'])}` ({r['trained_mode']}) | "
                    f"{part_text(r['eval']['tau_by_part'] or {}, 'positions')} |") if i == 0 else "| | | |"
            lines.append(f"{head} `{json.dumps(b['chat_template_kwargs'])}` ({b['mode']}) | {b['tau']:.2f} "
                         f"({b['prompts_set']}) | "
                         f"{part_text(b['tau_by_part'] or {}, 'rounds')} | {'yes' if b['identical_to_greedy'] else 'NO'} |")
    lines += ["", "doctor's thinking_mode holds: " + ", ".join(
        f"{r['template']} {'yes' if r['doctor_thinking_mode_holds'] else 'no'}" for r in results), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    from specdraft.api import cpu_label

    cpu = cpu_label()
    results = [one_case(*case, args.samples, args.epochs) for case in CASES]
    out = ROOT / "benchmarks" / "results" / "thinking_modes.json"
    out.write_text(json.dumps({"cpu": cpu, "samples": args.samples, "epochs": args.epochs, "results": results},
                              indent=2) + "\n")
    out.with_suffix(".md").write_text(table(results, cpu))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
