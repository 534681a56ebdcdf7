"""Seconds from `specdraft generate` on a target shape this machine never saw to its first token (issue 56).

    .venv/bin/python benchmarks/first_token.py [--hidden 1024 --intermediate 3072 --layers 28]
        [--tokens 24] [--runs 1]

A target of a new shape makes the loop time its Linear kernels (kernels.py) before the first forward; the
goal is at most 30 s from launch to the first token on 2 cores, the kernel timing included. The target is
a random-weight Qwen3 of a small Qwen3's shape (default: Qwen3-0.6B's widths and depth, SmolLM2's
tokenizer and vocabulary), built offline from its config. Each case runs the CLI in a subprocess on a new,
empty SPECDRAFT_CACHE (cold: every kernel shape unknown), then once more on that cache (warm); the time to
the first byte the CLI streams on stdout is the first token. Cases: plain decoding (`--method greedy`) and
an untrained EAGLE-3 drafter at K=3 (its Linears are timed too). Writes
benchmarks/results/first_token-KIND.json and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from verify_cost import cpu_kind  # noqa: E402

from specdraft import kernels, machine  # noqa: E402
from specdraft.api import load_tokenizer  # noqa: E402

CASES = {"greedy": ["--method", "greedy"], "eagle3-untrained-k3": ["--drafter", "untrained", "-k", "3"]}


def build_target(folder: Path, hidden: int, intermediate: int, layers: int) -> None:
    """A random Qwen3 of this shape with the default target's tokenizer, saved as an HF folder."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = load_tokenizer("default")
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def first_token(command: list[str], cache: Path) -> dict:
    """Launch -> first stdout byte, launch -> exit, and the kernel lines the CLI printed."""
    env = {**os.environ, "SPECDRAFT_CACHE": str(cache)}
    env.pop("SPECDRAFT_KERNEL_PATH", None)
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.read(1)
    first = time.perf_counter() - start
    proc.stdout.read()
    err = proc.stderr.read().decode()
    if proc.wait():
        raise SystemExit(f"{' '.join(command)} failed:\n{err[-2000:]}")
    return {"first_token_s": round(first, 1), "total_s": round(time.perf_counter() - start, 1),
            "kernel_lines": [line for line in err.splitlines() if line.startswith("kernel paths")]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()
    cli = str(Path(sys.executable).parent / "specdraft")
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "target"
        build_target(target, args.hidden, args.intermediate, args.layers)
        rows = {}
        for name, extra in CASES.items():
            cache = Path(tmp) / f"cache-{name}"
            command = [cli, "generate", "-m", str(target), "-p", "Hello there", "--max-new-tokens",
                       str(args.tokens), *extra]
            rows[name] = {"cold": first_token(command, cache), "warm": first_token(command, cache)}
            print(f"{name}: first token {rows[name]['cold']['first_token_s']} s cold, "
                  f"{rows[name]['warm']['first_token_s']} s warm", flush=True)
    result = {"cpu": machine.cpu_info()["cpu"], "cpu_kind": cpu_kind(), "threads": os.cpu_count(),
              "kernel_budget_s": kernels.KERNEL_BUDGET_S, "goal_s": 30,
              "target": {"family": "qwen3 (random weights)", "hidden": args.hidden,
                         "intermediate": args.intermediate, "layers": args.layers},
              "tokens": args.tokens, "cases": rows}
    out = Path(__file__).parent / "results" / f"first_token-{cpu_kind()}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# First token on a new target shape ({result['cpu_kind']}, goal <= 30 s)", "",
             "| case | first token, cold cache (s) | total (s) | first token, warm (s) |", "|---|---|---|---|"]
    lines += [f"| {n} | {r['cold']['first_token_s']} | {r['cold']['total_s']} | {r['warm']['first_token_s']} |"
              for n, r in rows.items()]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
