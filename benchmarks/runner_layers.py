"""The verify runner's speed layers, each on and off: what pad rows, the measured kernels and compile buy.

    .venv/bin/python benchmarks/runner_layers.py [--model default] [--prompts natural] [--limit 8]
        [--tokens 64] [--k 3] [--rounds 3] [--threads 2] [--dtype float32|bfloat16] [--compile]

TargetRunner (infer/speculative.py) is an exact core (masks, static cache, one verify forward, cache
surgery) with speed layers on top: pad rows (every round R rows, so a round's bits never depend on its
draft), the few-row Linear kernels measured on this machine (kernels.py), and, opt-in, torch.compile.
Each configuration below decodes the same prompts with plain decoding (no drafts) and with n-gram drafts
at K (a training-free proposer, so the benchmark needs no drafter), interleaved per round, the order
rotated; tok/s is the median round's, and every ratio is against `core` for the same method:

  core          no pad rows (a round runs its own rows), F.linear everywhere
  pad           + pad rows
  kernels       core + the measured few-row kernels, no pad rows
  pad+kernels   pad rows and the measured kernels: what generate and bench run by default
  compile       pad rows + torch.compile for the verify rounds (--compile; graphs compiled before timing)

Outputs are checked against `pad+kernels` plain decoding (identical in fp32; other dtypes may differ by a
rounding tie where the shape changes). Writes benchmarks/results/runner_layers-KIND[-bf16].json and a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from verify_cost import cpu_kind  # noqa: E402

from specdraft import machine  # noqa: E402
from specdraft.api import generate, load_target, NgramProposer, prompt_ids, read_prompts  # noqa: E402

CONFIGS = {"core": dict(pad_rows=False, kernels=False), "pad": dict(pad_rows=True, kernels=False),
           "kernels": dict(pad_rows=False, kernels=True), "pad+kernels": dict(pad_rows=True, kernels=True),
           "compile": dict(pad_rows=True, compile=True)}


def decode_all(model, prompts: list[list[int]], k: int, tokens: int, config: dict) -> tuple[float, list, float]:
    """(tok/s, the outputs, τ) over every prompt: plain decoding when k is 0, else n-gram drafts at K=k."""
    outputs, seconds, accepted, rounds = [], 0.0, 0, 0
    for ids in prompts:
        proposer = NgramProposer(k) if k else None
        gen = generate(model, ids, proposer, max_new_tokens=tokens, eos_token_ids=set(), rows=1 + k, **config)
        outputs.append(gen.token_ids)
        seconds += gen.seconds
        accepted, rounds = accepted + sum(gen.accepted), rounds + len(gen.accepted)
    return sum(map(len, outputs)) / seconds, outputs, (accepted + rounds) / rounds if rounds else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", default="natural")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--compile", action="store_true", help="also time the verify rounds under torch.compile")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(args.model, dtype=args.dtype)
    prompts = [prompt_ids(target.tokenizer, m) for m in read_prompts(args.prompts, args.limit)]
    configs = {n: c for n, c in CONFIGS.items() if args.compile or not c.get("compile")}
    cases = [(name, k) for name in configs for k in (0, args.k)]
    reference = decode_all(target.model, prompts, 0, args.tokens, CONFIGS["pad+kernels"])[1]
    for name, k in cases:                                    # warm-up: kernel tables, compiled graphs
        decode_all(target.model, prompts[:1], k, 4, configs[name])
    speed = {case: [] for case in cases}
    same, tau = {}, {}
    for r in range(args.rounds):
        for case in cases[r % len(cases):] + cases[:r % len(cases)]:
            tok_s, outputs, tau[case] = decode_all(target.model, prompts, case[1], args.tokens, configs[case[0]])
            speed[case].append(tok_s)
            same[case] = sum(a == b for a, b in zip(outputs, reference))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} K={k} {speed[(n, k)][-1]:.1f}" for n, k in cases),
              file=sys.stderr, flush=True)
    median = {case: statistics.median(v) for case, v in speed.items()}
    rows = [{"config": n, "method": "ngram" if k else "plain", "k": k, "tokens_per_s": round(median[(n, k)], 2),
             "x_core": round(median[(n, k)] / median[("core", k)], 3), "tau": round(tau[(n, k)], 3),
             "identical_to_plain": f"{same[(n, k)]}/{len(prompts)}", "samples": [round(v, 2) for v in speed[(n, k)]]}
            for n, k in cases]
    kind = cpu_kind() + ("-bf16" if args.dtype != "float32" else "")
    result = {"benchmark": "runner_layers", "cpu": machine.cpu_info()["cpu"], "cpu_kind": cpu_kind(),
              "model": args.model, "dtype": args.dtype, "threads": args.threads, "prompts": args.prompts,
              "num_prompts": len(prompts), "tokens": args.tokens, "k": args.k, "rounds": args.rounds, "rows": rows}
    out = Path(__file__).parent / "results" / f"runner_layers-{kind}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Runner speed layers on and off ({kind}, {args.model} {args.dtype}, {len(prompts)} {args.prompts} "
             f"prompts x {args.tokens} tokens, {args.threads} threads; ratio: x `core` for the same method)", "",
             "| config | method | tok/s | x core | τ | identical to plain |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['method']}{' K=%d' % r['k'] if r['k'] else ''} | {r['tokens_per_s']} | "
              f"{r['x_core']} | {r['tau']} | {r['identical_to_plain']} |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
