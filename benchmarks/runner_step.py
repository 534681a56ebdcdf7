"""Where a decode step's time goes: transformers' generate vs specdraft's loop, piece by piece.

    .venv/bin/python benchmarks/runner_step.py [--model default] [--context 128] [--steps 32]
        [--rounds 5] [--threads 2] [--dtype float32|bfloat16]

Speculative decoding pays per round what plain decoding pays per token, plus the drafts. So the
loop's own 1-token forward (TargetRunner.verify: tensors built per call, the aux-layer taps, the
kernel paths of kernels.py, cache bookkeeping, Python per step) must cost no more than a step
of transformers' generate (issue 23). Each variant below decodes `steps` tokens after a prompt of
`context` tokens, and its per-step time is (time for 1 + steps tokens - time for 1 token) / steps,
so the prefill drops out. Variants run interleaved, the order rotated per round; medians kept:

  hf_generate          transformers' model.generate, greedy (what the bench's greedy runs)
  bare_forward         model(...) on one token with a DynamicCache and argmax, nothing else: the floor
  loop_linear          specdraft's loop with no drafter, every Linear on F.linear (transformers' kernel)
  loop_linear_taps     + the aux-layer taps an EAGLE-3 drafter needs (3 layers, hooks)
  loop_measured        the loop with the kernel paths measured for this machine, no taps
  loop_measured_taps   + the taps: what an eagle3 round costs in the target before any draft

Every variant's tokens are checked equal to hf_generate's. Writes benchmarks/results/runner_step-KIND.json
and a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from verify_cost import cpu_kind  # noqa: E402

from specdraft import kernels, machine  # noqa: E402
from specdraft.infer import speculative  # noqa: E402
from specdraft.infer.tree import Draft  # noqa: E402
from specdraft.api import load_target  # noqa: E402

VARIANTS = ("hf_generate", "bare_forward", "loop_linear", "loop_linear_taps", "loop_measured", "loop_measured_taps")


class NoDraft:
    """A proposer that taps the aux layers and drafts nothing: the loop's cost without a drafter."""

    max_nodes = 0

    def __init__(self, aux_layer_ids: list[int]):
        self.aux_layer_ids = aux_layer_ids
        self.profile = speculative.Profile()

    def reset(self) -> None:
        pass

    def observe(self, aux) -> None:
        pass

    def propose(self, tokens, budget, sampling, generator) -> Draft:
        return Draft([], [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--out", default=None, help="default: benchmarks/results/runner_step-KIND[-bf16].json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out or f"benchmarks/results/runner_step-{cpu_kind()}{'-bf16' if args.dtype != 'float32' else ''}.json")

    from transformers import DynamicCache

    model = load_target(args.model, dtype=args.dtype).model
    L = model.config.num_hidden_layers
    taps = [2, L // 2, L - 3]                               # where EAGLE-3 taps (any 3 layers cost alike)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (args.context,), generator=g).tolist()

    def hf_generate(n: int) -> list[int]:
        x = torch.tensor([prompt])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    @torch.inference_mode()
    def bare_forward(n: int) -> list[int]:
        cache = DynamicCache(config=model.config)
        kw = {speculative.cache_kwarg(model): cache}
        logits = model(input_ids=torch.tensor([prompt]), use_cache=True, logits_to_keep=1, **kw).logits
        tokens = [int(logits[0, -1].argmax())]
        while len(tokens) < n:
            logits = model(input_ids=torch.tensor([[tokens[-1]]]), use_cache=True, logits_to_keep=1, **kw).logits
            tokens.append(int(logits[0, -1].argmax()))
        return tokens

    def loop(mode: str, with_taps: bool):
        def run(n: int) -> list[int]:
            proposer = NoDraft(taps) if with_taps else None
            return speculative.generate(model, prompt, proposer, max_new_tokens=n, eos_token_ids=set(),
                                        kernels=mode == "measured").token_ids
        return run

    variants = {"hf_generate": hf_generate, "bare_forward": bare_forward,
                "loop_linear": loop("linear", False), "loop_linear_taps": loop("linear", True),
                "loop_measured": loop("measured", False), "loop_measured_taps": loop("measured", True)}
    reference = hf_generate(1 + args.steps)
    identical = {name: run(1 + args.steps) == reference for name, run in variants.items()}   # and warm-up
    step_ms: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        names = list(variants)[r % len(variants):] + list(variants)[:r % len(variants)]
        for name in names:
            start = time.perf_counter()
            variants[name](1)
            one = time.perf_counter() - start
            start = time.perf_counter()
            variants[name](1 + args.steps)
            many = time.perf_counter() - start
            step_ms[name].append(1000 * (many - one) / args.steps)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {step_ms[n][-1]:.1f}" for n in variants),
              file=sys.stderr, flush=True)

    med = {n: statistics.median(v) for n, v in step_ms.items()}
    base = med["hf_generate"]
    rows = [{"variant": n, "step_ms": med[n], "min_ms": min(step_ms[n]), "max_ms": max(step_ms[n]),
             "vs_hf_generate": med[n] / base, "identical_to_hf_generate": identical[n], "samples_ms": step_ms[n]}
            for n in variants]
    pieces = {
        "generate_overhead_ms": med["hf_generate"] - med["bare_forward"],
        "loop_overhead_ms": med["loop_linear"] - med["bare_forward"],
        "taps_ms": med["loop_linear_taps"] - med["loop_linear"],
        "kernel_paths_ms": med["loop_measured"] - med["loop_linear"],
    }
    report = {"benchmark": "runner_step", "model": args.model, "dtype": args.dtype, "context": args.context,
              "steps": args.steps, "rounds": args.rounds, "threads": args.threads, "taps": taps,
              "rows": rows, "pieces": pieces, "kernels": kernels.describe(model),
              "cpu": {**machine.cpu_info(), "kind": cpu_kind()},
              "goal": "the loop's 1-token step within 5% of transformers' generate step (issue 23)",
              "environment": {"torch": torch.__version__}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")

    table = Table(title=f"one decode step ({args.model} {args.dtype}, prompt {args.context}, {args.steps} steps, "
                        f"{args.threads} threads, median of {args.rounds} rounds; {report['cpu']['cpu']})")
    for col in ("variant", "ms / step", "min-max", "x hf_generate", "same tokens"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in rows:
        table.add_row(r["variant"], f"{r['step_ms']:.1f}", f"{r['min_ms']:.1f}-{r['max_ms']:.1f}",
                      f"{r['vs_hf_generate']:.2f}", "yes" if r["identical_to_hf_generate"] else "NO")
    Console().print(table)
    print("pieces (ms per step): " + ", ".join(f"{k[:-3]} {v:+.1f}" for k, v in pieces.items()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
