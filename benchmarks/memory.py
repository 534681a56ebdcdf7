"""Peak resident memory of `specdraft capture` and `specdraft train` at 1x and 4x data.

    .venv/bin/python benchmarks/memory.py [--tokens 12000] [--hidden 256] [--scales 1,4]

A tiny random Llama (H=--hidden, 4 layers, byte tokenizer) and synthetic prepared data of
--tokens x scale tokens; each CLI stage runs as its own subprocess (one torch thread) and its
peak RSS is read from os.wait4's rusage (ru_maxrss of exactly that child). A stage that streams
its data keeps a flat peak as the data grows; the ratio 4x/1x says whether it does.
Writes benchmarks/results/memory.json and prints a table.
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

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def peak_rss(args: list[str], log: Path) -> tuple[float, float]:
    """(peak RSS in MB, seconds) of `specdraft ARGS` run as a child of this process."""
    start = time.perf_counter()
    with open(log, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "specdraft.cli", *map(str, args)], env=ENV,
                                stdout=f, stderr=f)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"specdraft {args[0]} failed (rc {proc.returncode}); see {log}")
    return usage.ru_maxrss / 1024, time.perf_counter() - start   # Linux: ru_maxrss is in KB


def make_data(folder: Path, target, tokens: int, seq: int = 512) -> None:
    """Synthetic prepared data: tokens // seq samples of random byte tokens, loss on the second half."""
    import torch

    from specdraft.api import save_prepared

    n = max(1, tokens // seq)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(7, target.vocab_size, (n, seq), generator=g).tolist()
    mask = [[0] * (seq // 2) + [1] * (seq - seq // 2)] * n
    save_prepared(folder, {"input_ids": ids, "loss_mask": mask, "messages": ["[]"] * n},
                  {"source": "benchmarks/memory.py", "target": target.identity,
                   "counts": {"samples": n, "tokens": n * seq}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=12288, help="tokens at scale 1")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "memory.json")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    args = ap.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table

    from specdraft import vocab as vocab_mod
    from specdraft.api import load_target
    from specdraft.testing import save_tiny_target

    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="specdraft-bench-memory-"))
    log = work / "memory.log"
    model = save_tiny_target(work / "target", hidden_size=args.hidden, num_layers=4, num_heads=4,
                             num_kv_heads=2, intermediate_size=2 * args.hidden)
    target = load_target(str(model))
    rows = []
    for scale in [int(s) for s in args.scales.split(",")]:
        ws = work / f"x{scale}"
        make_data(ws / "data", target, args.tokens * scale)
        capture_mb, capture_s = peak_rss(["capture", "--model", model, "--prepared", ws / "data", "--out", ws / "hidden",
                                          "--layers", "1,2,3", "--shard-tokens", "4096", "--batch-tokens", "2048"], log)
        store_mb = sum(p.stat().st_size for p in (ws / "hidden").glob("shard-*")) / 1e6
        vocab_mod.build_from_data(ws / "data", 128, ws / "vocab.safetensors", model=str(model))
        train_mb, train_s = peak_rss(["train", "--model", model, "--store", ws / "hidden", "--vocab",
                                      ws / "vocab.safetensors", "--out", ws / "run", "--epochs", "1",
                                      "--max-tokens", "512", "--val-fraction", "0.05", "--precision", "fp32",
                                      "--no-progress", "--log-every", "50"], log)
        rows.append({"scale": scale, "tokens": args.tokens * scale, "store_mb": round(store_mb, 1),
                     "capture_peak_rss_mb": round(capture_mb, 1), "capture_s": round(capture_s, 1),
                     "train_peak_rss_mb": round(train_mb, 1), "train_s": round(train_s, 1)})
        print(json.dumps(rows[-1]), flush=True)

    first, last = rows[0], rows[-1]
    result = {
        "target": {"hidden_size": args.hidden, "num_layers": 4, "vocab_size": target.vocab_size},
        "store_dtype": "bfloat16",
        "rows": rows,
        "ratio_capture": round(last["capture_peak_rss_mb"] / first["capture_peak_rss_mb"], 3),
        "ratio_train": round(last["train_peak_rss_mb"] / first["train_peak_rss_mb"], 3),
        "ratio_store": round(last["store_mb"] / first["store_mb"], 3),
        "command": "benchmarks/memory.py " + " ".join(sys.argv[1:]),
        "threads": 1,
        "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"peak RSS (MB), tiny Llama H={args.hidden}, store in bf16")
    for col in ("scale", "tokens", "store MB", "capture peak", "train peak"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['scale']}x", f"{r['tokens']:,}", f"{r['store_mb']:.1f}", f"{r['capture_peak_rss_mb']:.0f}",
                      f"{r['train_peak_rss_mb']:.0f}")
    Console().print(table)
    print(f"ratio {last['scale']}x/{first['scale']}x: store {result['ratio_store']}, capture "
          f"{result['ratio_capture']}, train {result['ratio_train']} -> {args.out}")


if __name__ == "__main__":
    main()
