"""τ of any bench method on every natural prompt, by replaying greedy decoding over the target's answers.

    .venv/bin/python benchmarks/replay.py --natural WS/nat/data --drafter RUN
        [--methods eagle3,hybrid] [-k 3] [--datastore WS/data] [--limit 0] [--max-new-tokens 128]
        [--label NAME] [--check BENCH_JSON]

Under greedy decoding the target accepts a draft exactly as far as it agrees with the target's own
answer, and the hidden states a drafter reads are the target's over that answer. So the loop of
infer/speculative.generate can run without a verify forward: one target forward per prompt computes
the hidden states of every position (the capture's own hooks, fp32), and each round's accepted path is
`greedy_path` with the answer's next tokens as the target's choices. The proposers are bench's own
(`methods.build_methods`: the family's chain, its tree, hybrid, ngram, with the datastore), fed exactly
what generate feeds them, so τ and the per-position rates are bench's, in minutes instead of a
27-minute bench, and on all 96 prompts. The answers come from `prepare --conversations
benchmarks/prompts/natural.jsonl --regenerate --compute-dtype float32` (batched greedy; a row whose batched answer parts from
batch-1 greedy would make the replay part from bench there). --check BENCH_JSON compares with a
bench.json measured on the same prompts. Writes benchmarks/results/replay[-LABEL].json and a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ngram_datastore import answers_to_replay  # noqa: E402

from specdraft.analysis.probe import target_hidden  # noqa: E402
from specdraft.api import load_drafter_for, load_target, Sampling, SpecdraftError  # noqa: E402
from specdraft.infer.methods import build_methods  # noqa: E402
from specdraft.infer.ngram import Datastore, assistant_spans  # noqa: E402
from specdraft.infer.prompts import read_prompt_rows  # noqa: E402
from specdraft.infer.speculative import Profile, per_position_accept  # noqa: E402
from specdraft.infer.tree import Draft, TreeShape, greedy_path  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def replay_one(proposer, ids: list[int], start: int, end: int, aux: torch.Tensor | None
               ) -> tuple[list[int], list[int]]:
    """generate()'s loop over one answer ids[start:end], the target's forwards replaced by the answer:
    -> (accepted, proposed) per round, as Generation records them."""
    sampling, generator = Sampling(), torch.Generator().manual_seed(0)
    proposer.profile = Profile()
    proposer.reset()
    proposer.observe(None if aux is None else aux[:start])   # the prefill: every prompt position
    tokens, accepted, proposed = list(ids[:start + 1]), [], []   # the first token comes from the prefill
    while len(tokens) < end:
        budget = end - len(tokens) - 1                  # drafts past the answer's end are never used
        draft = proposer.propose(tokens, budget, sampling, generator) if budget > 0 else Draft([], [])
        root = len(tokens) - 1
        choice = [ids[root + 1 + d] if root + 1 + d < end else -1 for d in draft.depths()]
        path = greedy_path(draft, choice)
        proposer.observe(None if aux is None else aux[root:root + len(path)])   # the verified root and the accepted drafts
        accepted.append(len(path) - 1)
        proposed.append(max(draft.depths()))
        tokens.extend(ids[root + 1:min(root + 1 + len(path), end)])
    return accepted, proposed


def summary(accepted: list[int], proposed: list[int]) -> dict:
    rounds = len(accepted)
    return {"tau": (sum(accepted) + rounds) / rounds if rounds else 1.0, "rounds": rounds,
            "per_position": [round(x, 4) for x in per_position_accept(accepted, proposed)]}


def natural_answers(prepared: Path, limit: int = 0, max_new_tokens: int = 128) -> list[tuple[list[int], int, int]]:
    """(tokens, answer start, answer end) of the first `limit` answers (0: all), cut at max_new_tokens."""
    samples = answers_to_replay(prepared)[:limit or None]
    return [(ids[:min(end, start + max_new_tokens)], start, min(end, start + max_new_tokens))
            for ids, start, end in samples]


def categories(prepared: Path, prompts: Path, count: int) -> list[str]:
    """The category of each of the first `count` replayed answers, from the prompts file's `category` by
    the first user turn ('' where the prompts file does not hold it); in answers_to_replay's order."""
    from specdraft.api import load_prepared

    by_question = {row.messages[0]["content"]: row.category or "" for row in read_prompt_rows(str(prompts))}
    ds, _ = load_prepared(prepared)
    kept = [json.loads(m)[0]["content"] for m, mask in zip(ds["messages"], ds["loss_mask"]) if assistant_spans(mask)]
    return [by_question.get(q, "") for q in kept[:count]]


def by_category(rows: dict[str, dict], cats: list[str]) -> list[str]:
    """A table: the mean per-prompt τ of each method in each category (where a drafter loses to n-gram)."""
    names = list(dict.fromkeys(c for c in cats if c))
    table = ["| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for name, r in rows.items():
        means = [sum(t for t, c in zip(r["per_prompt_tau"], cats) if c == n) / cats.count(n) for n in names]
        table.append(f"| {name} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return table if names else []


def replay_methods(target, methods, samples, on_prompt=None) -> dict[str, dict]:
    """Every method (methods.Method with a proposer) replayed over every answer: {name: summary + per-prompt τ}.
    One target forward per answer and aux layer set gives the hidden states all methods read."""
    runs = {m.name: ([], [], []) for m in methods}                      # accepted, proposed, per-prompt τ
    for n, (ids, start, end) in enumerate(samples, 1):
        hidden = {}
        for m in methods:
            layers = tuple(m.proposer.aux_layer_ids or [])
            if layers not in hidden:
                hidden[layers] = target_hidden(target, [ids], list(layers))[0] if layers else None
            acc, prop = replay_one(m.proposer, ids, start, end, hidden[layers])
            runs[m.name][0].extend(acc)
            runs[m.name][1].extend(prop)
            runs[m.name][2].append(summary(acc, prop)["tau"])
        if on_prompt:
            on_prompt(n, {name: summary(acc, prop)["tau"] for name, (acc, prop, _) in runs.items()})
    return {name: {**summary(acc, prop), "per_prompt_tau": [round(t, 4) for t in taus]}
            for name, (acc, prop, taus) in runs.items()}


def refuse(line: str) -> None:
    print(f"error: {line}", file=sys.stderr)
    raise SystemExit(2)


def check_inputs(a, target) -> None:
    """Identities by fingerprint, never by name: the natural answers and the datastore must be this target's
    (prepare.json's fingerprint), and a --check bench.json a bench of this target at this K and length."""
    from specdraft.api import load_prepared
    from specdraft.data.prepared import check_prepared_for
    from specdraft.targets import same_target

    try:
        check_prepared_for(load_prepared(a.natural)[1], target, a.natural, "replay")
    except SpecdraftError as e:
        refuse(f"--natural {e}")
    if a.check is None:
        return
    config = json.loads(a.check.read_text()).get("config") or {}
    fingerprint = config.get("target_fingerprint")
    if fingerprint and not same_target(fingerprint, target.identity):
        refuse(f"--check {a.check}: a bench of {config.get('model')} (fingerprint {fingerprint}), but --model is "
               f"{target.name} (fingerprint {target.identity['fingerprint']}); compare with a bench of this target")
    for field, want in (("k", a.k), ("max_new_tokens", a.max_new_tokens)):
        if config.get(field) != want:
            refuse(f"--check {a.check}: field 'config.{field}' is {config.get(field)!r} but this replay runs "
                   f"{want!r}; pass the bench's value, or a bench run with it")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--natural", type=Path, required=True, help="prepared data of the natural prompts' answers")
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--methods", default="eagle3,hybrid", help="bench method names (the family's chain, "
                    "FAMILY-tree, hybrid, hybrid-tree, ngram)")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--tree", default="3,2,6", help="the tree of FAMILY-tree and hybrid-tree")
    ap.add_argument("--datastore", type=Path, default=None, help="prepared data ngram and hybrid also draft from")
    ap.add_argument("--limit", type=int, default=0, help="first N prompts (0: all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--hybrid-switch", action="store_true", help="hybrid in its switch form (one chain per "
                    "round), not the tree (infer/hybrid.py)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--label", default="")
    ap.add_argument("--check", type=Path, default=None, help="a bench.json on the same prompts to compare with")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--prompts", type=Path, default=ROOT / "benchmarks" / "prompts" / "natural.jsonl",
                    help="the prompts file whose `category` labels the per-category table")
    a = ap.parse_args()
    torch.manual_seed(0)
    samples = natural_answers(a.natural, a.limit, a.max_new_tokens)
    target = load_target(a.model)
    check_inputs(a, target)
    drafter = load_drafter_for(a.drafter, target)
    try:
        store = Datastore.from_prepared(a.datastore, target) if a.datastore else None
    except SpecdraftError as e:
        refuse(str(e))
    names = a.methods.split(",")
    tree = TreeShape.parse(a.tree)
    methods = build_methods(names, drafter, a.k, tree, 3, 1, datastore=store, hybrid_tree=not a.hybrid_switch)
    started = time.perf_counter()

    def shown(n, taus):
        if n % 8 == 0 or n == len(samples):
            print(f"{n}/{len(samples)} prompts, {time.perf_counter() - started:.0f} s: "
                  + ", ".join(f"{k} τ {t:.3f}" for k, t in taus.items()), flush=True)

    rows = replay_methods(target, methods, samples, shown)
    check = {}
    if a.check:
        bench = json.loads(a.check.read_text())["methods"]
        check = {name: {"bench_tau": bench[name]["accept_len"], "replay_tau": rows[name]["tau"],
                        "bench_per_position": bench[name]["per_position_accept"]}
                 for name in rows if name in bench}
        for name, c in check.items():
            print(f"{name}: replay τ {c['replay_tau']:.4f}, bench τ {c['bench_tau']:.4f}")
    config = {"natural": str(a.natural), "prompts": len(samples), "drafter": str(a.drafter), "k": a.k,
              "max_new_tokens": a.max_new_tokens, "datastore": str(a.datastore) if a.datastore else None,
              "hybrid_form": "switch" if a.hybrid_switch else "tree",
              "seconds": round(time.perf_counter() - started, 1), "check": str(a.check) if a.check else None}
    a.results.mkdir(parents=True, exist_ok=True)
    stem = a.results / f"replay{'-' + a.label if a.label else ''}"
    stem.with_suffix(".json").write_text(json.dumps({"config": config, "methods": rows, "check": check}, indent=2))
    table = [f"| method | τ (K={a.k}), {len(samples)} natural prompts, replay | accepted per position | rounds |",
             "|---|---|---|---|"]
    table += [f"| {name} | {r['tau']:.2f} | {' '.join(f'{x:.2f}' for x in r['per_position'])} | {r['rounds']} |"
              for name, r in rows.items()]
    cats = categories(a.natural, a.prompts, len(samples)) if a.prompts.exists() else []
    per_category = by_category(rows, cats)
    if per_category:
        table += ["", f"Mean per-prompt τ by category (K={a.k}):", "", *per_category]
    stem.with_suffix(".md").write_text("\n".join(table) + "\n")
    print(f"-> {stem}.json, {stem}.md")


if __name__ == "__main__":
    main()
