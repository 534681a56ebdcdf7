"""Long context (issue 38): train memory and speed against row length, and τ by context bucket.

    .venv/bin/python benchmarks/long_context.py --drafters ws/runs/short,ws/runs/long [--model default]
        [--rows 512,2048,8192] [--steps 4] [--sliding-window 0] [--limit 8] [--max-context 8192]
        [--bench-tokens 64] [-k 3] [--label NAME]

Part 1, per row length L of --rows, in a child process of its own (so its peak RSS is its own): a
drafter of the default family, fresh, trains --steps steps on one packed row of L tokens whose hidden
states the target computes from a long document (data/documents.py: the standard library's source),
with `--sliding-window` if given; recorded: the child's peak RSS (ru_maxrss), the train tokens per
second over the steps after the first (the first pays allocation), the loss.

Part 2, per drafter of --drafters: `specdraft bench --prompts long` (the long-context set up to
--max-context, one round, greedy and the drafter's chain at -k K), and its τ by context bucket
(`by_context`), so the 512-row drafter's decay shows beside the long-row one's.

Writes benchmarks/results/long_context[-LABEL].json and a Markdown table beside it. Run nothing else
meanwhile: RSS and tokens/s are the measurement.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def train_row(model: str, length: int, steps: int, window: int) -> dict:
    """In this process: a fresh drafter trains `steps` steps on one row of `length` tokens."""
    import torch

    from specdraft.analysis.probe import sample_batch, target_hidden
    from specdraft.data.documents import build_document
    from specdraft.families import DEFAULT, family
    from specdraft.api import load_target, RunConfig
    from specdraft.targets import default_aux_layers
    from specdraft.train.objective import TeacherHead

    torch.manual_seed(0)
    target = load_target(model)
    tok = target.tokenizer
    text = build_document(0, length, lambda t: len(tok(t, add_special_tokens=False)["input_ids"])).text
    ids = (tok(text, add_special_tokens=False)["input_ids"] * length)[:length]     # exactly L tokens
    layers = default_aux_layers(target.model.config.num_hidden_layers)
    aux, last = target_hidden(target, [ids], layers)
    batch = sample_batch(ids, aux, last, [1] * length)
    fam = family(DEFAULT)
    run = RunConfig(sliding_window=window)
    V = target.model.config.vocab_size
    n = min(V, 8192)
    drafter = fam.build(fam.new_config(target.model.config, n, layers, target.name, run))
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[:n] = True
    fam.init_from_target(drafter, target, torch.zeros(n, dtype=torch.long), t2d, run)
    objective = fam.objective(drafter, TeacherHead.from_target(target.model, drafter.d2t), run).train()
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4)
    seconds, loss = [], None
    for _ in range(steps):
        start = time.perf_counter()
        loss, _ = objective(batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        seconds.append(time.perf_counter() - start)
    timed = seconds[1:] or seconds
    return {"row_tokens": length, "steps": steps, "sliding_window": window, "loss": float(loss),
            "train_tok_per_s": length * len(timed) / sum(timed),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def family_name(drafter: str) -> str:
    """The family of a drafter folder (its config.json's speculators_model_type); untrained: the default."""
    from specdraft.families import DEFAULT
    from specdraft.formats.checkpoints import resolve_checkpoint

    if drafter.startswith("untrained"):
        return DEFAULT
    return json.loads((resolve_checkpoint(drafter) / "config.json").read_text()).get("speculators_model_type", DEFAULT)


def bench_by_context(model: str, drafter: str, limit: int, max_context: int | None, tokens: int, k: int,
                     out: Path) -> dict:
    """`specdraft bench --prompts long` of one drafter -> its chain's τ, K and by_context."""
    args = ["bench", "--model", model, "--drafter", drafter, "--prompts", "long", "--limit", str(limit),
            "--max-new-tokens", str(tokens), "-k", str(k), "--rounds", "1", "--out", str(out)]
    drafter_type = family_name(drafter)
    args[args.index("--limit"):args.index("--limit")] = ["--methods", f"greedy,{drafter_type}"]
    if max_context:
        args += ["--max-context", str(max_context)]
    print("$ specdraft " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "specdraft.cli", *args], check=True)
    result = json.loads(out.read_text())["methods"][drafter_type]
    return {"drafter": drafter, "family": drafter_type, "tau": result["accept_len"], "k": k,
            "identical_to_greedy": result["identical_to_greedy"], "by_context": result["by_context"]}


def table(report: dict) -> str:
    from specdraft.metrics import bucket_text

    lines = ["| row tokens | peak RSS (MB) | train tok/s | loss |", "|---|---|---|---|"]
    lines += [f"| {r['row_tokens']} | {r['peak_rss_mb']:.0f} | {r['train_tok_per_s']:.1f} | {r['loss']:.3f} |"
              for r in report["train"]]
    lines += ["", "| drafter | τ (K) | τ by context |", "|---|---|---|"]
    lines += [f"| {b['drafter']} | {b['tau']:.2f} (K={b['k']}) | {bucket_text(b['by_context'])} |"
              for b in report["bench"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--rows", default="512,2048,8192")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--sliding-window", type=int, default=0)
    ap.add_argument("--drafters", default="", help="comma list of drafters (run folders) to bench on the long set")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--bench-tokens", type=int, default=64)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--label", default="")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--one-row", type=int, default=None, help=argparse.SUPPRESS)   # the child of part 1
    a = ap.parse_args()
    if a.one_row is not None:
        print(json.dumps(train_row(a.model, a.one_row, a.steps, a.sliding_window)))
        return
    a.results.mkdir(parents=True, exist_ok=True)
    name = "long_context" + (f"-{a.label}" if a.label else "")
    report = {"model": a.model, "sliding_window": a.sliding_window, "train": [], "bench": []}
    for length in [int(x) for x in a.rows.split(",") if x.strip()]:
        done = subprocess.run([sys.executable, __file__, "--model", a.model, "--one-row", str(length), "--steps",
                               str(a.steps), "--sliding-window", str(a.sliding_window)],
                              check=True, capture_output=True, text=True)
        report["train"].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(report["train"][-1], flush=True)
    for i, drafter in enumerate(d for d in a.drafters.split(",") if d.strip()):
        report["bench"].append(bench_by_context(a.model, drafter, a.limit, a.max_context, a.bench_tokens, a.k,
                                                a.results / f"{name}-bench-{i}.json"))
    (a.results / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (a.results / f"{name}.md").write_text(table(report))
    print(table(report))


if __name__ == "__main__":
    main()
