"""Capture overhead: the plain target forward vs the full capture path on the same batches.

    .venv/bin/python benchmarks/capture.py [--model default] [--batch 8] [--seq 512] [--repeats 3]

Both sides run the base model (model.model, no lm_head) over the same right-sized batch of
random token ids; the capture side is `specdraft.data.capture.capture` end to end (hooks,
copying to the store dtype, NaN check, writing + hashing the shard, manifest). Repeats are
interleaved (plain, capture, plain, capture, ...) so drift on a shared machine hits both, and
medians are reported. Writes benchmarks/results/capture.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", help="store dtype")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "capture.json")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from specdraft.data import capture as cap
    from specdraft.data import store as st
    from specdraft.api import load_target, save_prepared
    from specdraft.targets import base_model

    console = Console()
    target = load_target(args.model)
    base = base_model(target.model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (args.batch, args.seq), generator=g)   # [B, T]
    tokens = args.batch * args.seq
    work = Path(tempfile.mkdtemp(prefix="specdraft-bench-capture-"))
    save_prepared(work / "data", {"input_ids": ids.tolist(), "loss_mask": [[1] * args.seq] * args.batch,
                                  "messages": ["[]"] * args.batch}, {"target": target.identity})

    def plain() -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            base(input_ids=ids, use_cache=False)
        return time.perf_counter() - t0

    def capture(k: int) -> float:
        out = work / f"hidden-{k}"
        t0 = time.perf_counter()
        cap.capture(model=args.model, data=work / "data", out=out, dtype=args.dtype, batch_tokens=tokens,
                    shard_tokens=tokens, target=target, progress=False)
        seconds = time.perf_counter() - t0
        shutil.rmtree(out)
        return seconds

    with torch.inference_mode():
        base(input_ids=ids[:1, :64], use_cache=False)   # warm-up (allocator, kernels)
    plain_s, capture_s = [], []
    for k in range(args.repeats):
        plain_s.append(plain())
        capture_s.append(capture(k))
        console.print(f"repeat {k + 1}/{args.repeats}: plain {plain_s[-1]:.2f}s, capture {capture_s[-1]:.2f}s")

    H = target.hidden_size
    plain_tps = tokens / statistics.median(plain_s)
    capture_tps = tokens / statistics.median(capture_s)
    result = {
        "model": target.name, "hidden_size": H, "num_layers": target.num_layers,
        "batch": args.batch, "seq": args.seq, "tokens_per_batch": tokens, "repeats": args.repeats,
        "store_dtype": args.dtype, "torch_threads": torch.get_num_threads(),
        "plain_seconds": plain_s, "capture_seconds": capture_s,
        "plain_tokens_per_s": plain_tps, "capture_tokens_per_s": capture_tps,
        "throughput_ratio": capture_tps / plain_tps, "goal_ratio": 0.90,
        "store_bytes_per_token_hidden": 4 * H * st.STORE_DTYPES[st.dtype_name(args.dtype)].itemsize,
        "store_bytes_per_token_total": st.bytes_per_token(H, args.dtype),
    }
    shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"capture vs plain forward: {target.name}, {args.batch} x {args.seq} tokens, "
                        f"median of {args.repeats}")
    table.add_column("path")
    table.add_column("median s", justify="right")
    table.add_column("tokens/s", justify="right")
    table.add_row("plain model.model forward", f"{statistics.median(plain_s):.2f}", f"{plain_tps:,.0f}")
    table.add_row(f"capture ({args.dtype} store)", f"{statistics.median(capture_s):.2f}", f"{capture_tps:,.0f}")
    console.print(table)
    ok = "meets" if result["throughput_ratio"] >= 0.90 else "MISSES"
    console.print(f"throughput ratio capture/plain = {result['throughput_ratio']:.3f} ({ok} the 0.90 goal); "
                  f"store: {result['store_bytes_per_token_hidden']} B/token of hidden states "
                  f"(3 aux + last), {result['store_bytes_per_token_total']} B/token with ids and mask")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
