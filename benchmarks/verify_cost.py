"""Cost of verifying n tokens in one target forward, relative to decoding 1 token.

    .venv/bin/python benchmarks/verify_cost.py [--model default] [--context 300] [--n-max 8]
        [--repeats 9] [--threads 2]

Speculative decoding only pays if a target forward over the root + K drafts costs about what a
1-token forward costs. On a CPU the weights are read once per forward either way, but
`F.linear` on 2-8 rows takes MKL's small-GEMM path, which here costs ~2x the 1-row path. The
verify loop (infer/speculative.py) therefore runs the target's linears as mm(W, x^T)
(`few_row_matmul`). This benchmark times one forward over n = 1..n_max new tokens on top of a
KV cache of `context` tokens, plain transformers vs inside `few_row_matmul`, interleaved (each
repeat times every n in both modes back to back, so machine noise hits both alike), and checks
the logits agree. Writes benchmarks/results/verify_cost.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from specdraft.infer.speculative import cache_kwarg, few_row_matmul, target_linears
from specdraft.targets import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/verify_cost.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import DynamicCache

    model = load_target(args.model).model
    linears = target_linears(model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    with_cache = {cache_kwarg(model): cache}
    with torch.inference_mode():
        model(input_ids=torch.randint(0, vocab, (1, args.context), generator=g), use_cache=True, **with_cache,
              logits_to_keep=1)

    def forward(ids: torch.Tensor, few_rows: bool) -> tuple[float, torch.Tensor]:
        n = ids.shape[1]
        pos = torch.arange(args.context, args.context + n)[None]                  # [1, n]
        with torch.inference_mode():
            start = time.perf_counter()
            if few_rows:
                with few_row_matmul(model, linears):
                    logits = model(input_ids=ids, position_ids=pos, use_cache=True, **with_cache).logits
            else:
                logits = model(input_ids=ids, position_ids=pos, use_cache=True, **with_cache).logits
            seconds = time.perf_counter() - start
            cache.crop(-n)                                                        # back to `context`
        return seconds, logits

    ns = list(range(1, args.n_max + 1))
    times = {(n, mode): [] for n in ns for mode in (False, True)}
    max_diff = {n: 0.0 for n in ns}
    for ids in [torch.randint(0, vocab, (1, n), generator=g) for n in ns]:       # warm-up
        forward(ids, False), forward(ids, True)
    for _ in range(args.repeats):
        for n in ns:
            ids = torch.randint(0, vocab, (1, n), generator=g)                   # [1, n]
            s_plain, plain = forward(ids, False)
            s_few, few = forward(ids, True)
            times[n, False].append(s_plain)
            times[n, True].append(s_few)
            max_diff[n] = max(max_diff[n], float((plain - few).abs().max()))

    med = {key: 1000 * statistics.median(v) for key, v in times.items()}
    one = med[1, False]
    rows = [{"n": n, "plain_ms": med[n, False], "few_row_ms": med[n, True],
             "plain_vs_1": med[n, False] / one, "few_row_vs_1": med[n, True] / one,
             "max_abs_logit_diff": max_diff[n]} for n in ns]
    report = {"benchmark": "verify_cost", "model": args.model, "context": args.context,
              "repeats": args.repeats, "threads": args.threads, "rows": rows,
              "environment": {"torch": torch.__version__, "cpu": platform.processor() or platform.machine()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    table = Table(title=f"one target forward over n new tokens ({args.model}, cache {args.context}, "
                        f"{args.threads} threads, median of {args.repeats})")
    for col in ("n", "transformers ms", "x 1-token", "few_row_matmul ms", "x 1-token", "max |logit diff|"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["n"]), f"{r['plain_ms']:.1f}", f"{r['plain_vs_1']:.2f}", f"{r['few_row_ms']:.1f}",
                      f"{r['few_row_vs_1']:.2f}", f"{r['max_abs_logit_diff']:.1e}")
    Console().print(table)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
