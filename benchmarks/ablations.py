"""Training ablations of issue 17, each measured by acceptance on held-out prompts.

    .venv/bin/python benchmarks/ablations.py --workspace ws/demo [--variants base,fc_norm,...]
        [--store WS/hidden] [--prompts-per-set 6] [--max-new-tokens 128] [-k 4]

Every variant trains with the quick recipe (src/specdraft/recipes/quick.yaml) plus its own flags,
on the same store and vocab (the demo's unless --store/--vocab say otherwise), into
WS/ablations/NAME, by running `specdraft train` as a user would. Then its best checkpoint drafts
in our loop (K-token chain, greedy) on two held-out prompt sets: the builtin hold-out prompts
(the demo's bench set, same templates as the training prompts) and benchmarks/prompts/natural.jsonl
(questions written outside the project). Reported per variant: bench τ (mean accepted tokens +1
per target forward) and per-position acceptance on each set, the run's own validation sim τ,
and the training wall time. τ under greedy is deterministic: a busy machine changes only the
wall times. A finished variant is not retrained (delete its folder to redo it).

Writes benchmarks/results/ablations.json (merged with earlier variants) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "src" / "specdraft" / "recipes" / "quick.yaml"
NATURAL = ROOT / "benchmarks" / "prompts" / "natural.jsonl"
RESULTS = ROOT / "benchmarks" / "results" / "ablations.json"

VARIANTS = {
    "base": [],
    "ttt_draft_inputs": ["--ttt-inputs", "draft"],
    "fc_norm": ["--fc-norm", "--norm-output"],
    "loss_tv": ["--loss", "tv"],
    "loss_jsd": ["--loss", "jsd"],
    "init_target_layer": ["--init-layer", "target"],
    "init_target_layer+fc_norm": ["--init-layer", "target", "--fc-norm", "--norm-output"],
}


def train(name: str, flags: list[str], ws: Path, store: Path, vocab: Path) -> tuple[Path, float | None]:
    """(run folder, training seconds, or None when an earlier invocation trained it)."""
    run = ws / "ablations" / name
    if (run / "best").is_dir():
        return run, None
    command = [str(Path(sys.executable).parent / "specdraft"), "train", "--config", str(QUICK), "--model", "default",
               "--store", str(store), "--vocab", str(vocab), "--out", str(run), "--overwrite", *flags]
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return run, time.perf_counter() - start


def sim_tau(run: Path) -> float | None:
    """The run's last validation accept_len (metrics.jsonl), the simulated τ over its TTT steps."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    vals = [r for r in records if r.get("split") == "val"]
    return vals[-1]["metrics"].get("accept_len") if vals else None


def bench_tau(target, drafter, conversations, k: int, max_new_tokens: int) -> dict:
    from specdraft.api import generate, prompt_ids
    from specdraft.model.eagle3.proposer import EagleProposer
    from specdraft.infer.speculative import eos_ids_of, per_position_accept

    eos = eos_ids_of(target.model, target.tokenizer)
    accepted, proposed = [], []
    for messages in conversations:
        gen = generate(target.model, prompt_ids(target.tokenizer, messages), EagleProposer(drafter, k=k),
                       max_new_tokens, None, eos)
        accepted += gen.accepted
        proposed += gen.proposed
    rounds = len(accepted)
    return {"tau": (sum(accepted) + rounds) / rounds, "per_position_accept": per_position_accept(accepted, proposed),
            "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", default="ws/demo")
    ap.add_argument("--store", default=None, help="default WS/hidden")
    ap.add_argument("--vocab", default=None, help="default WS/vocab.safetensors")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--name-suffix", default="", help="appended to each variant's name (e.g. _self for another store)")
    ap.add_argument("--prompts-per-set", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", type=Path, default=RESULTS, help="JSON to merge the variants into")
    ap.add_argument("--remeasure", action="store_true", help="measure τ again for variants already in the results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from specdraft.api import load_drafter_for, load_target, read_prompts

    ws = Path(args.workspace)
    store, vocab = Path(args.store or ws / "hidden"), Path(args.vocab or ws / "vocab.safetensors")
    sets = {"builtin-holdout": read_prompts("builtin-holdout", args.prompts_per_set),
            "natural": read_prompts(str(NATURAL), args.prompts_per_set)}
    target = load_target("default", dtype="float32", device="cpu")
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
        run, seconds = train(name + args.name_suffix, VARIANTS[name], ws, store, vocab)
        drafter = load_drafter_for(run / "best", target)
        row = {"flags": VARIANTS[name], "store": str(store), "run": str(run), "sim_tau": sim_tau(run),
               "train_seconds": seconds if seconds is not None else results.get(name + args.name_suffix, {}).get(
                   "train_seconds"),
               "k": args.k, "max_new_tokens": args.max_new_tokens, "prompts_per_set": args.prompts_per_set}
        old = results.get(name + args.name_suffix, {})
        for set_name, conversations in sets.items():
            same = all(old.get(key) == row[key] for key in ("k", "max_new_tokens", "prompts_per_set", "run"))
            row[set_name] = (old[set_name] if same and set_name in old and not args.remeasure
                             else bench_tau(target, drafter, conversations, args.k, args.max_new_tokens))
        results[name + args.name_suffix] = row
        args.results.parent.mkdir(parents=True, exist_ok=True)
        latest = json.loads(args.results.read_text()) if args.results.exists() else {}
        latest[name + args.name_suffix] = row      # merge: another run may have written other variants
        args.results.write_text(json.dumps(latest, indent=1) + "\n")
        results.update(latest)
        print_table(results)


def print_table(results: dict) -> None:
    print(f"\n{'variant':<24} {'sim τ':>6} {'τ holdout':>9} {'τ natural':>9}  per-position (holdout | natural)  train s")
    for name, r in results.items():
        pos = " ".join(f"{a:.2f}" for a in r["builtin-holdout"]["per_position_accept"])
        nat = " ".join(f"{a:.2f}" for a in r["natural"]["per_position_accept"])
        secs = r.get("train_seconds")
        print(f"{name:<24} {r['sim_tau'] or float('nan'):>6.3f} {r['builtin-holdout']['tau']:>9.2f} "
              f"{r['natural']['tau']:>9.2f}  {pos} | {nat}  {secs and round(secs)}")


if __name__ == "__main__":
    main()
