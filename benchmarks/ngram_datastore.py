"""n-gram τ with and without a datastore on all 96 natural prompts, in seconds and without the target.

    .venv/bin/python benchmarks/ngram_datastore.py --natural WS/nat/data --datastore mix256=WS/data
        [--datastore NAME=PREPARED ...] [-k 3] [--label NAME]

Under greedy decoding a draft is accepted exactly as far as it agrees with the target's own answer, so
replaying the proposer over answers the target already wrote (`prepare --conversations
benchmarks/prompts/natural.jsonl --regenerate --compute-dtype float32 --max-new-tokens 128`) gives the τ a bench would
measure, round by round, with no target forward. The replay calls the proposer's own lookup
(infer/ngram.py draft_tokens), so it measures the code bench runs. Each --datastore is prepared data
whose answers the lookup also drafts from (the target's answers to *training* prompts, never the
natural set's). Also replayed: the natural set's first 16 prompts at 96 tokens, the subset the
recipes' natural bench measures (data_scaling.py), to compare with a bench.json.
Writes benchmarks/results/ngram_datastore[-LABEL].json and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdraft.infer.ngram import Datastore, assistant_spans, draft_tokens  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def answers_to_replay(prepared: Path) -> list[tuple[list[int], int, int]]:
    """(tokens, start, end) of each sample's last assistant turn: the answer generation would write.
    Only float32 answers replay bench's fp32 greedy: prepare's default dtype is measured per machine
    and may be bf16, so a store regenerated in another dtype is refused."""
    from specdraft.api import load_prepared

    ds, meta = load_prepared(prepared)
    dtype = (meta.get("regeneration") or {}).get("compute_dtype") or "float32"
    if dtype != "float32":
        raise SystemExit(f"{prepared}: answers regenerated in {dtype}, but replay stands for fp32 greedy; "
                         "prepare it again with --compute-dtype float32")
    return [(list(ids), *spans[-1]) for ids, mask in zip(ds["input_ids"], ds["loss_mask"])
            if (spans := assistant_spans(mask))]


def replay(samples, k: int, store: Datastore | None, ngram=(3, 1)) -> dict:
    """Greedy speculative decoding replayed over the answers: per round, the draft's accepted prefix.
    per_position as bench's: position i accepted over the rounds that offered it."""
    rounds = tokens = 0
    accepted, offered = np.zeros(k), np.zeros(k)
    for ids, start, end in samples:
        p = start
        while p < end:
            draft, _ = draft_tokens(ids[:p], min(k, end - p), ngram[0], ngram[1], store)
            a = 0
            while a < len(draft) and ids[p + a] == draft[a]:
                a += 1
            accepted[:a] += 1
            offered[:len(draft)] += 1
            step = min(a + 1, end - p)
            tokens, rounds, p = tokens + step, rounds + 1, p + step
    rates = [round(float(x / n), 4) if n else 0.0 for x, n in zip(accepted, offered)]
    return {"tau": tokens / rounds, "per_position": rates, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--natural", type=Path, required=True, help="prepared data of the natural prompts' answers")
    ap.add_argument("--datastore", action="append", default=[], help="NAME=PREPARED, repeatable")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--label", default="")
    ap.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args()
    every = answers_to_replay(a.natural)
    subsets = {f"all {len(every)} prompts, whole answers": every,
               "first 16 prompts, 96 tokens (the recipes' natural bench)":
                   [(ids, s, min(e, s + 96)) for ids, s, e in every[:16]]}
    stores = {"none (the context only)": None}
    for spec in a.datastore:
        name, _, path = spec.rpartition("=")
        started = time.perf_counter()
        stores[name or path] = store = Datastore.from_prepared(path)
        store.table(a.k)
        print(f"datastore {name or path}: {store.describe(path)} built in {time.perf_counter() - started:.1f} s")
    rows = []
    for subset, samples in subsets.items():
        for name, store in stores.items():
            rows.append({"prompts": subset, "datastore": name, **(store.describe(name) if store else {}),
                         **replay(samples, a.k, store)})
            print(f"{subset} | {name}: τ {rows[-1]['tau']:.3f} {rows[-1]['per_position']}", flush=True)
    a.results.mkdir(parents=True, exist_ok=True)
    stem = a.results / f"ngram_datastore{'-' + a.label if a.label else ''}"
    stem.with_suffix(".json").write_text(json.dumps({"k": a.k, "natural": str(a.natural), "rows": rows}, indent=2))
    table = ["| prompts | datastore | answer tokens in it | τ (K=%d) | accepted per position |" % a.k, "|---|---|---|---|---|"]
    table += [f"| {r['prompts']} | {r['datastore']} | {r.get('tokens', 0):,} | {r['tau']:.2f} "
              f"| {' '.join(f'{x:.2f}' for x in r['per_position'])} |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(table) + "\n")
    print(f"-> {stem}.json, {stem}.md")


if __name__ == "__main__":
    main()
