"""The data engine: regeneration and capture tokens/s, vLLM vs transformers, same prompts.

    .venv/bin/python benchmarks/engine.py [--samples 128] [--batch 64] [--new-tokens 128] [--rounds 2]
        [--engines hf,vllm,hf:bfloat16,hf:auto,vllm:bfloat16:128] [--no-capture]

Regeneration engines: hf is `prepare --engine hf` (transformers' generate over left-padded batches of
--batch prompts), vllm the offline vLLM engine; ENGINE:DTYPE sets prepare's --compute-dtype (float32
unless named: today's path; auto is what prepare picks on this machine), ENGINE:DTYPE:BATCH its
--batch-size for that engine alone (vLLM batches what it is given). Ratios are against the first
engine named, from the same rounds; each row also counts the answers equal to that engine's.

Each measurement runs in a child process of its own (a clean engine, a clean peak-memory figure:
the child and every process it starts, summed, sampled every 0.1 s), in interleaved rounds:
hf regenerate, vllm regenerate, hf capture, vllm capture, then again, so drift on a shared
machine hits every method. Regeneration is `specdraft prepare --regenerate` on the builtin
prompts (tokens/s from its own stats, which leave out loading the model and starting the engine);
capture is the store writer over the same prepared data (the transformers-regenerated one of
round 1), timed without the engine start, which is reported apart. fp32 on CPU, as the tests.
Writes benchmarks/results/engine.json and prints a table; the goal on a CPU is parity (vLLM at
least 0.9x transformers): vLLM's win is on GPUs and clusters.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("hf", "vllm")


def child_regenerate(job: dict) -> dict:
    from specdraft.api import prepare

    engine, dtype, batch = (job["engine"].split(":") + ["", ""])[:3]
    meta = prepare(model=job["model"], source="builtin", out=job["out"], regenerate=True, limit=job["samples"],
                   max_new_tokens=job["new_tokens"], batch_size=int(batch or job["batch"]), engine=engine,
                   compute_dtype=dtype or "float32")
    regen = meta["regeneration"]
    answers = [json.loads(line)["messages"] for line in (Path(job["out"]) / "regen.jsonl").read_text().splitlines()]
    return {"tokens": regen["new_tokens"], "seconds": regen["seconds"], "samples": regen["generated"],
            "compute_dtype": regen["compute_dtype"], "answers": answers}


def child_capture(job: dict) -> dict:
    """capture()'s own loop (hidden_state_engine + StoreWriter), timed apart from the engine start."""
    import torch

    from specdraft.data import store as st
    from specdraft.data.capture import hidden_state_engine
    from specdraft.api import load_prepared, load_target
    from specdraft.data.vllm_engine import engine_options
    from specdraft.targets import default_aux_layers, describe_target

    ds, _ = load_prepared(job["data"])
    rows = ds[:]
    lengths = [len(s) for s in rows["input_ids"]]
    target = describe_target(job["model"]) if job["engine"] == "vllm" else load_target(job["model"])
    layers = default_aux_layers(target.num_layers)
    out = Path(job["out"])
    writer = st.StoreWriter(out, st.new_manifest(target.identity, layers, "bfloat16", target.hidden_size))
    started = time.perf_counter()
    with hidden_state_engine(job["engine"], target, layers, torch.bfloat16, 4096, "float32",
                             engine_options(job["engine"]), max(lengths), out) as run_target:
        ready = time.perf_counter()
        for a, b in st.plan_shards(lengths, 65536):
            aux, last, offsets = run_target(rows["input_ids"][a:b], first_index=a)
            ids = torch.tensor([t for s in rows["input_ids"][a:b] for t in s], dtype=torch.int64)
            mask = torch.tensor([m for s in rows["loss_mask"][a:b] for m in s], dtype=torch.uint8)
            writer.write_shard(aux, last, ids, mask, offsets)
        done = time.perf_counter()
    return {"tokens": sum(lengths), "seconds": done - ready, "engine_start_seconds": ready - started}


def run_child(kind: str, job: dict, work: Path) -> dict:
    """Run one measurement in a child process; add its peak memory (the whole process tree)."""
    import psutil

    job_file = work / f"{kind}-{job['engine'].replace(':', '-')}-{job['round']}.json"
    job_file.write_text(json.dumps(job))
    proc = subprocess.Popen([sys.executable, __file__, "--child", kind, "--job", str(job_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, stop = [0], threading.Event()

    def sample():
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in procs if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.1)
    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    stop.set()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"{kind} with {job['engine']} failed (exit {proc.returncode}):\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "tokens_per_s": result["tokens"] / result["seconds"], "peak_rss_gib": peak[0] / 2**30}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--samples", type=int, default=128, help="builtin prompts regenerated")
    ap.add_argument("--batch", type=int, default=64, help="rows decoded at once (prepare --batch-size)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="regeneration engines to compare")
    ap.add_argument("--no-capture", action="store_true", help="regeneration only")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "engine.json")
    ap.add_argument("--child", choices=["regenerate", "capture"], help=argparse.SUPPRESS)
    ap.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        job = json.loads(args.job.read_text())
        result = (child_regenerate if args.child == "regenerate" else child_capture)(job)
        print(json.dumps(result))
        return

    from rich.console import Console
    from rich.table import Table

    from specdraft.data.vllm_engine import vllm_version

    console = Console()
    work = Path(tempfile.mkdtemp(prefix="specdraft-bench-engine-"))
    regen_engines = args.engines.split(",")
    capture_engines = () if args.no_capture else ENGINES
    runs: dict[str, dict[str, list[dict]]] = {"regenerate": {e: [] for e in regen_engines},
                                              "capture": {e: [] for e in capture_engines}}
    data, reference = None, None
    for r in range(args.rounds):
        for engine in regen_engines:
            job = {"model": args.model, "engine": engine, "round": r, "samples": args.samples, "batch": args.batch,
                   "new_tokens": args.new_tokens, "out": str(work / f"data-{engine.replace(':', '-')}-{r}")}
            run = run_child("regenerate", job, work)
            answers = run.pop("answers")
            reference = reference or answers
            run["equal_answers"] = len({json.dumps(a) for a in answers} & {json.dumps(a) for a in reference})
            runs["regenerate"][engine].append(run)
            data = data or job["out"]        # capture reads round 1's first data, every time
            console.print(f"round {r + 1}: regenerate {engine} ({run['compute_dtype']}): {run['tokens_per_s']:.1f} "
                          f"tok/s, {run['equal_answers']}/{len(answers)} answers equal to {regen_engines[0]}'s")
        for engine in capture_engines:
            job = {"model": args.model, "engine": engine, "round": r, "data": data,
                   "out": str(work / f"hidden-{engine}-{r}")}
            runs["capture"][engine].append(run_child("capture", job, work))
            console.print(f"round {r + 1}: capture {engine}: {runs['capture'][engine][-1]['tokens_per_s']:.1f} tok/s")

    summary = {}
    for kind, by_engine in runs.items():
        if not by_engine:
            continue
        med = {e: statistics.median(x["tokens_per_s"] for x in by_engine[e]) for e in by_engine}
        baseline = next(iter(med))
        summary[kind] = {"median_tokens_per_s": med, "vs_baseline": {e: med[e] / med[baseline] for e in med},
                         "baseline": baseline,
                         "peak_rss_gib": {e: max(x["peak_rss_gib"] for x in by_engine[e]) for e in by_engine},
                         "equal_answers": {e: min(x.get("equal_answers", -1) for x in by_engine[e]) for e in by_engine}}
        if "vllm" in med and "hf" in med:
            summary[kind]["vllm_vs_hf"] = med["vllm"] / med["hf"]
    starts = [x["engine_start_seconds"] for x in runs["capture"].get("vllm", [])]
    import torch
    import transformers

    from specdraft.api import cpu_label

    result = {"model": args.model, "samples": args.samples, "batch": args.batch, "new_tokens": args.new_tokens,
              "rounds": args.rounds, "cpu": cpu_label(),
              "dtype": "regeneration: each run's compute_dtype; capture: float32 compute, bfloat16 store",
              "cpu_count": os.cpu_count(),
              "versions": {"vllm": vllm_version(), "transformers": transformers.__version__,
                           "torch": torch.__version__},
              "goal_vllm_vs_hf": 0.9, "summary": summary, "vllm_capture_engine_start_seconds": starts,
              "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"data engine on {args.model}: {args.samples} prompts x <= {args.new_tokens} new tokens, "
                        f"median of {args.rounds} interleaved rounds")
    for col in ("stage", "engine", "tok/s", "x baseline", "peak RSS", "answers equal to baseline's"):
        table.add_column(col, justify="right" if col not in ("stage", "engine") else "left")
    for kind, s in summary.items():
        for e, tps in s["median_tokens_per_s"].items():
            table.add_row(kind, e, f"{tps:.1f}", f"{s['vs_baseline'][e]:.2f}x ({s['baseline']})",
                          f"{s['peak_rss_gib'][e]:.2f} GiB",
                          f"{s['equal_answers'][e]}/{args.samples}" if s["equal_answers"][e] >= 0 else "-")
    console.print(table)
    if starts:
        console.print(f"vLLM capture engine start: {', '.join(f'{s:.0f} s' for s in starts)} (not in tok/s)")
    console.print(f"{result['cpu']}; wrote {args.out}")


if __name__ == "__main__":
    main()
