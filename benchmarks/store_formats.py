"""Store formats of issue 26 side by side: bytes, capture and training speed, and τ, per format.

    .venv/bin/python benchmarks/store_formats.py --workspace ws/demo [--formats bf16,fp8,compact]
        [--prompts-per-set 6] [--max-new-tokens 96] [-k 4] [--threads 2]
    .venv/bin/python benchmarks/store_formats.py --smoke        # a tiny random target: checks the script runs

Needs the demo workspace's prepared data and vocab (`make demo`: WS/data, WS/vocab.safetensors).
Per format it captures WS/store_formats/FORMAT/hidden from WS/data with `capture --store-format`,
trains the quick recipe on it (src/specdraft/recipes/quick.yaml, same seed for every format) into
WS/store_formats/FORMAT/run, then measures:
  - bytes per token at the target's H, measured (shard files / tokens), and at H=7168 by the
    format's formula (data/store_formats.py), each also as a fraction of bf16;
  - capture tok/s and training tok/s (tokens_seen / training seconds);
  - sim τ (the run's last validation accept_len) and bench τ (greedy K-token chains on the builtin
    hold-out prompts; deterministic, so a busy machine changes only the speeds).
Writes benchmarks/results/store_formats.json and prints a table. Goals (issue 26): compact <= 0.25x
bf16 at H=7168 (<= 0.30x at H=576) with both τ within 0.03 of bf16; fp8 ~0.5x within 0.01.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
QUICK = ROOT / "src" / "specdraft" / "recipes" / "quick.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "store_formats.json"
K25_HIDDEN = 7168


def capture_store(model: str, prepared: Path, out: Path, store_format: str) -> dict:
    """Capture (or reuse a finished) store; returns its manifest and the capture's tok/s (None if reused)."""
    from specdraft.data import capture as cap
    from specdraft.data import store as st

    if (out / st.MANIFEST).exists() and st.read_manifest(out).get("complete"):
        return {"manifest": st.read_manifest(out), "capture_tok_per_s": None}
    start = time.perf_counter()
    manifest = cap.capture(model=model, data=prepared, out=out, store_format=store_format, progress=False)
    return {"manifest": manifest, "capture_tok_per_s": manifest["num_tokens"] / (time.perf_counter() - start)}


def measured_bytes_per_token(store: Path, manifest: dict) -> float:
    return sum((store / e["file"]).stat().st_size for e in manifest["shards"]) / manifest["num_tokens"]


def train_run(store: Path, vocab: Path, model: str, out: Path, overrides: dict) -> dict:
    """The quick recipe on `store`; returns the summary and training tok/s."""
    from specdraft.api import resolve_config, train

    cfg = resolve_config(QUICK, store=str(store), vocab=str(vocab), model=model, out=str(out), overwrite=True,
                         progress=False, **overrides)
    start = time.perf_counter()
    summary = train(cfg)
    return {"summary": summary, "train_tok_per_s": summary["tokens_seen"] / (time.perf_counter() - start)}


def row_for(store_format: str, ws: Path, model: str, vocab: Path, overrides: dict, target, prompts, k: int,
            max_new_tokens: int) -> dict:
    from ablations import bench_tau, sim_tau
    from specdraft.data import store_formats as sf
    from specdraft.api import load_drafter_for

    folder = ws / "store_formats" / store_format
    captured = capture_store(model, ws / "data", folder / "hidden", store_format)
    manifest = captured["manifest"]
    H, n_aux = manifest["hidden_size"], len(manifest["layer_ids"])
    trained = train_run(folder / "hidden", vocab, model, folder / "run", overrides)
    drafter = load_drafter_for(folder / "run" / "best", target)
    bench = bench_tau(target, drafter, prompts, k, max_new_tokens)
    return {"store_format": store_format, "hidden_size": H, "num_tokens": manifest["num_tokens"],
            "bytes_per_token_measured": measured_bytes_per_token(folder / "hidden", manifest),
            "bytes_per_token_formula": sf.bytes_per_token(store_format, H, n_aux),
            f"bytes_per_token_formula_h{K25_HIDDEN}": sf.bytes_per_token(store_format, K25_HIDDEN, n_aux),
            "ratio_vs_bf16_formula": sf.bytes_per_token(store_format, H, n_aux) / sf.bytes_per_token("bf16", H, n_aux),
            f"ratio_vs_bf16_h{K25_HIDDEN}": (sf.bytes_per_token(store_format, K25_HIDDEN, n_aux)
                                            / sf.bytes_per_token("bf16", K25_HIDDEN, n_aux)),
            "capture_tok_per_s": captured["capture_tok_per_s"], "train_tok_per_s": trained["train_tok_per_s"],
            "sim_tau": sim_tau(folder / "run"), "bench_tau": bench["tau"],
            "bench_per_position_accept": bench["per_position_accept"], "k": k, "max_new_tokens": max_new_tokens,
            "prompts": len(prompts)}


def smoke_workspace(root: Path) -> tuple[str, dict]:
    """A tiny random target, 16 prepared samples and a 64-token vocab under root: (model, train overrides)."""
    from specdraft import vocab as vocab_mod
    from specdraft.api import load_target, save_prepared
    from specdraft.testing import save_tiny_target

    model = str(save_tiny_target(root / "target"))
    target = load_target(model)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(7, 200, (20 + i,), generator=g).tolist() for i in range(16)]
    masks = [[0] * 5 + [1] * (len(s) - 5) for s in ids]
    save_prepared(root / "data", {"input_ids": ids, "loss_mask": masks, "messages": ["[]"] * len(ids)},
                  {"source": "smoke", "target": target.identity, "counts": {"samples": len(ids)}})
    counts = vocab_mod.count_tokens(torch.tensor(sum(ids, [])).numpy(), torch.tensor(sum(masks, [])).numpy(),
                                    target.vocab_size)
    d2t, t2d = vocab_mod.mapping_from_counts(counts, 64)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {"target_id": target.name, "fingerprint": target.identity["fingerprint"]}),
                   root / "vocab.safetensors")
    return model, {"epochs": 1, "max_tokens": 64, "warmup_steps": 1, "precision": "fp32", "train_on_prompts": False}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", default="ws/demo")
    ap.add_argument("--formats", default="bf16,fp8,compact")
    ap.add_argument("--prompts-per-set", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--smoke", action="store_true", help="a tiny random target in a temp folder (results not written)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from specdraft.api import load_target, read_prompts

    if args.smoke:
        ws = Path(tempfile.mkdtemp(prefix="store-formats-smoke-"))
        model, overrides = smoke_workspace(ws)
        prompts, max_new_tokens = read_prompts("builtin-holdout", 1), 8
    else:
        ws, model, overrides = Path(args.workspace), "default", {}
        prompts, max_new_tokens = read_prompts("builtin-holdout", args.prompts_per_set), args.max_new_tokens
    target = load_target(model, dtype="float32", device="cpu")
    rows = {}
    for name in [f.strip() for f in args.formats.split(",") if f.strip()]:
        rows[name] = row_for(name, ws, model, ws / "vocab.safetensors", overrides, target, prompts, args.k,
                             max_new_tokens)
        print_table(rows)
    if args.smoke:
        shutil.rmtree(ws, ignore_errors=True)
    else:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(rows, indent=1) + "\n")


def print_table(rows: dict) -> None:
    print(f"\n{'format':<8} {'B/tok H':>9} {'x bf16':>7} {'B/tok 7168':>10} {'x bf16':>7} {'cap tok/s':>9} "
          f"{'train tok/s':>11} {'sim τ':>6} {'bench τ':>7}")
    for name, r in rows.items():
        cap = r["capture_tok_per_s"]
        print(f"{name:<8} {r['bytes_per_token_measured']:>9.1f} {r['ratio_vs_bf16_formula']:>7.3f} "
              f"{r[f'bytes_per_token_formula_h{K25_HIDDEN}']:>10,} {r[f'ratio_vs_bf16_h{K25_HIDDEN}']:>7.3f} "
              f"{(cap or float('nan')):>9.0f} {r['train_tok_per_s']:>11.0f} {r['sim_tau'] or float('nan'):>6.3f} "
              f"{r['bench_tau']:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
