"""Plain decoding at the row count this machine measured cheapest (auto.plain_rows) against one row.

    .venv/bin/python benchmarks/plain_rows.py [--model default] [--prompts natural] [--limit 6] [--tokens 48]
        [--rounds 3] [--threads 2]

`generate --method greedy` and bench's `plain` run at R = auto.plain_rows (one real row, the rest pad rows) since
issue 56; before, at one row. Both decode the same prompts in the same process, interleaved per round, the order
alternated; tok/s is the median round's, the ratio is R=auto against R=1, and the outputs are compared. Writes
benchmarks/results/plain_rows-KIND.json and a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from verify_cost import cpu_kind  # noqa: E402

from specdraft.api import cpu_label, generate, load_target, plain_rows, prompt_ids, read_prompts  # noqa: E402


def decode_all(model, prompts: list[list[int]], tokens: int, rows: int) -> tuple[float, list]:
    gens = [generate(model, ids, None, max_new_tokens=tokens, eos_token_ids=set(), rows=rows) for ids in prompts]
    return sum(len(g.token_ids) for g in gens) / sum(g.seconds for g in gens), [g.token_ids for g in gens]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", default="natural")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(args.model, dtype="float32")
    prompts = [prompt_ids(target.tokenizer, m) for m in read_prompts(args.prompts, args.limit)]
    rows, curve = plain_rows(target.model, len(prompts[0]))
    cases = {"R=1": 1, f"R={rows} (plain_rows)": rows}
    for r in cases.values():                                       # warm-up: kernel tables
        decode_all(target.model, prompts[:1], 4, r)
    speed, outputs = {c: [] for c in cases}, {}
    for i in range(args.rounds):
        for case in list(cases)[i % 2:] + list(cases)[:i % 2]:
            tok_s, outputs[case] = decode_all(target.model, prompts, args.tokens, cases[case])
            speed[case].append(tok_s)
    base = statistics.median(speed["R=1"])
    rows_out = [{"case": c, "rows": r, "tok_s": round(statistics.median(speed[c]), 2),
                 "x_one_row": round(statistics.median(speed[c]) / base, 3),
                 "identical_to_one_row": outputs[c] == outputs["R=1"]} for c, r in cases.items()]
    result = {"cpu": cpu_label(), "model": target.name, "prompts": args.prompts, "limit": len(prompts),
              "tokens": args.tokens, "rounds": args.rounds, "threads": args.threads, "verify_curve_ms": curve,
              "rows": rows_out}
    out = Path(__file__).parent / "results" / f"plain_rows-{cpu_kind()}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"plain decoding on {result['cpu']}, {target.name} fp32, {len(prompts)} {args.prompts} prompts x "
          f"{args.tokens} tokens, {args.rounds} interleaved rounds (median); verify curve 1..4 rows: "
          + ", ".join(f"{x:.1f}" for x in curve) + " ms")
    print("| case | tok/s | x R=1 | identical to R=1 |\n|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['case']} | {r['tok_s']:.2f} | {r['x_one_row']:.2f} | {r['identical_to_one_row']} |")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
