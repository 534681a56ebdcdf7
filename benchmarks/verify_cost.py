"""Cost of verifying n tokens in one target forward, relative to decoding 1 token, per kernel path.

    .venv/bin/python benchmarks/verify_cost.py [--model default] [--context 300] [--n-max 8]
        [--repeats 9] [--threads 2] [--dtype float32|bfloat16]

Speculative decoding only pays if a target forward over the root + K drafts costs about what a
1-token forward costs. Which matmul makes that true depends on the CPU (kernels.py): this
benchmark times one forward over n = 1..n_max new tokens on top of a KV cache of `context` tokens
with every Linear on `F.linear` (plain transformers), on mm(W, x^T) at every few-row count (the
choice that was once hard-coded), on the path measured for this machine (what the loop runs), on oneDNN's prepacked Linear
(`onednn`: torch.utils.mkldnn.MkldnnLinear, the weights reordered once for its kernels),
and through the loop's own runner (`loop`: TargetRunner.verify at R = n rows over its static cache,
the forward shape generate() runs, issue 35), with `--compiled` also through that runner with the target
under torch.compile (`compiled`: inductor, dynamic=False, compiled once per R before timing: the runner's
shape never changes, so one compile serves every round; the compile seconds are reported), interleaved (each repeat times every n in every mode
back to back, so machine noise hits all alike), and checks the logits agree. Each time is also read
against the weight-streaming floor (streamed weight bytes / this machine's copy bandwidth, measured
in the same run: bandwidth.weight_floor). Writes one result per CPU kind,
benchmarks/results/verify_cost-KIND.json (the CPU's model name and flags inside), and a table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from specdraft import bandwidth, kernels, machine
from specdraft.infer.speculative import Profile, TargetRunner, cache_kwarg, few_row_matmul, target_linears
from specdraft.api import load_target

MODES = ("linear", "mm", "measured", "onednn", "loop")


def cpu_kind() -> str:
    """A file-name slug for this CPU kind: model name and vector ISA, e.g. amd-epyc-avx512-bf16."""
    info = machine.cpu_info()
    name = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\(r\)|\(tm\)|processor|cpu|@.*", "", info["cpu"].lower())).strip("-")
    return f"{name}-{machine.vector_isa(info)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--compiled", action="store_true", help="also time the runner under torch.compile (~20 s per n)")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/verify_cost-KIND[-bf16].json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out or f"benchmarks/results/verify_cost-{cpu_kind()}{'-bf16' if args.dtype != 'float32' else ''}.json")

    from transformers import DynamicCache

    model = load_target(args.model, dtype=args.dtype).model
    linears = target_linears(model)
    flags = {"linear": [(False,) * 33] * len(linears), "mm": [(True,) * 33] * len(linears),
             "measured": kernels.mm_flags(linears)}
    described = kernels.describe(model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    with_cache = {cache_kwarg(model): cache}
    context_ids = torch.randint(0, vocab, (1, args.context), generator=g)        # [1, context], every mode's
    with torch.inference_mode():
        model(input_ids=context_ids, use_cache=True, **with_cache, logits_to_keep=1)

    prefix = context_ids[0].tolist()
    modes = MODES + (("compiled",) if args.compiled else ())
    runners, compile_s = {}, {}
    compiled = torch.compile(model, dynamic=False) if args.compiled else None
    for n in range(1, args.n_max + 1):                                          # the loop's shape: R = n rows
        runners[n] = TargetRunner(model, None, Profile(), rows=n, max_len=args.context + n + 1)
        runners[n].prefill(prefix)
        if compiled is not None:                                                # prefill eager, verify compiled
            runners["compiled", n] = TargetRunner(model, None, Profile(), rows=n, max_len=args.context + n + 1)
            runners["compiled", n].prefill(prefix)
            runners["compiled", n].model = compiled
            start = time.perf_counter()
            forward_loop(runners["compiled", n], n, args.context, torch.zeros(1, n, dtype=torch.long))
            compile_s[n] = round(time.perf_counter() - start, 1)

    import torch.utils.mkldnn as onednn

    named = [(name, m) for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    packed = {name: onednn.MkldnnLinear(m, dtype=m.weight.dtype) for name, m in named}

    @contextmanager
    def prepacked():
        """Every Linear swapped for its prepacked oneDNN twin while the block runs."""
        def put(name, module):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, module)
        for name, _ in named:
            put(name, packed[name])
        try:
            yield
        finally:
            for name, m in named:
                put(name, m)

    def forward(ids: torch.Tensor, mode: str) -> tuple[float, torch.Tensor]:
        n = ids.shape[1]
        if mode in ("loop", "compiled"):
            return forward_loop(runners[n] if mode == "loop" else runners[mode, n], n, args.context, ids)
        pos = torch.arange(args.context, args.context + n)[None]                  # [1, n]
        with torch.inference_mode(), prepacked() if mode == "onednn" else few_row_matmul(model, linears, flags[mode]):
            start = time.perf_counter()
            logits = model(input_ids=ids, position_ids=pos, use_cache=True, **with_cache).logits
            seconds = time.perf_counter() - start
            cache.crop(-n)                                                        # back to `context`
        return seconds, logits

    ns = list(range(1, args.n_max + 1))
    times = {(n, mode): [] for n in ns for mode in modes}
    max_diff = {n: 0.0 for n in ns}
    for ids in [torch.randint(0, vocab, (1, n), generator=g) for n in ns]:       # warm-up
        for mode in modes:
            forward(ids, mode)
    for r in range(args.repeats):
        for n in ns:
            ids = torch.randint(0, vocab, (1, n), generator=g)                   # [1, n]
            logits = {}
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:          # order rotated per repeat
                seconds, logits[mode] = forward(ids, mode)
                times[n, mode].append(seconds)
            max_diff[n] = max(max_diff[n], *(float((logits["linear"] - logits[m]).abs().max()) for m in modes))

    med = {key: 1000 * statistics.median(v) for key, v in times.items()}
    floor = bandwidth.weight_floor(model)
    rows = [{"n": n, **{f"{m}_ms": med[n, m] for m in modes}, **{f"{m}_vs_1": med[n, m] / med[1, m] for m in modes},
             **{f"{m}_vs_floor": med[n, m] / floor["floor_ms"] for m in modes},
             "max_abs_logit_diff": max_diff[n]} for n in ns]
    report = {"benchmark": "verify_cost", "model": args.model, "dtype": args.dtype, "context": args.context,
              "repeats": args.repeats, **({"compile_s": compile_s} if compile_s else {}), "threads": args.threads, "rows": rows, "kernels": described, "floor": floor,
              "cpu": {**machine.cpu_info(), "kind": cpu_kind(), "flags": cpu_flags()},
              "goal": "verify(K+1) <= 1.15 x verify(1) for K <= 7, verify(1) <= verify(2); bf16 verify <= 1.5x floor (issue 35)",
              "environment": {"torch": torch.__version__}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")

    table = Table(title=f"one target forward over n new tokens ({args.model} {args.dtype}, cache {args.context}, "
                        f"{args.threads} threads, median of {args.repeats}; {report['cpu']['cpu']})")
    table.add_column("n", justify="right")
    for m in modes:
        table.add_column(f"{m} ms", justify="right")
        table.add_column("x 1-token", justify="right")
    table.add_column("max |logit diff|", justify="right")
    for r in rows:
        table.add_row(str(r["n"]), *(f"{r[f'{m}_{k}']:.{2 if k == 'vs_1' else 1}f}" for m in modes for k in ("ms", "vs_1")),
                      f"{r['max_abs_logit_diff']:.1e}")
    Console().print(table)
    print(bandwidth.floor_line(floor, [r["loop_ms"] for r in rows]) + " (loop)")
    print(kernels.format_paths(described))
    print(f"wrote {out}")


def forward_loop(runner: TargetRunner, n: int, context: int, ids: torch.Tensor) -> tuple[float, torch.Tensor]:
    """One verify of ids [1, n] through the loop's runner at R = n rows, then back to `context`."""
    start = time.perf_counter()
    logits, _ = runner.verify(ids[0].tolist(), list(range(context, context + n)))
    seconds = time.perf_counter() - start
    runner.keep(context, [])
    return seconds, logits[None]


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


if __name__ == "__main__":
    main()
