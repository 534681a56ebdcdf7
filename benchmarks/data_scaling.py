"""τ on prompts nobody tuned to, against the data the drafter saw and the CPU time it cost.

    .venv/bin/python benchmarks/data_scaling.py --workspace ws/scaling [--samples 256,512,1024]
        [--conversations builtin] [--max-new-tokens 128] [--set init_layer=target ...] [--label NAME]
        [--natural-limit 16] [--holdout-limit 6] [--bench-tokens 96] [-k 3] [--natural-store WS/nat/hidden]
        [--extra pydoc:300] [--temperature 0.8] [--follow-ups 0.5]

The same harness is the source and lever ablation: `--conversations self:N` or a mixture
(`builtin:0.5,self:0.5`) with a --label compares prompt sources, `--set init_layer=target` or
`--max-new-tokens 256` a lever, each against the plain run at equal samples; `--temperature T`
(sampled answers) and `--follow-ups X` (second turns the target writes) are prepare's own source knobs. `--extra SOURCE:N` is
the lever of data that needs no regeneration: N conversations of SOURCE (e.g. `pydoc`, Python's own
documentation as the answers) prepared as written and captured into a second store, and every
point trains over both stores (its held-out eval reads their union: `eval --store A --store B`).

For each sample count N: `specdraft prepare` (the target regenerates N answers; answers already in
another point's regen.jsonl are reused, so a curve costs its largest point), `capture`, `vocab build`
and `train --config quick.yaml` (plus any `--set KEY=VALUE` training setting: the levers), then `eval`
(τ on the store's held-out samples) and one `bench` round per prompt set, on the natural set (the
first --natural-limit of its 96 hand-written prompts: its lines alternate categories) and on the
builtin hold-out, with ngram, the drafter's chain and hybrid at -k K (n-gram and hybrid also drafting from
the point's answers, --datastore, as the recipes do): τ of each, each method's output checked equal to greedy. `--natural-store` (a store captured from the natural set's prompts:
`prepare --conversations benchmarks/prompts/natural.jsonl --regenerate --compute-dtype float32` then `capture`) adds the
drafter's τ on all 96 natural prompts by `eval` in seconds (greedy chain τ is the same number a bench
measures, without generating); --natural-limit 0 / --holdout-limit 0 skip a bench. Every stage's wall seconds are recorded, so τ is read against the
CPU minutes that bought it. Writes benchmarks/results/data_scaling[-LABEL].json, a Markdown table and a
PNG curve beside it. Run nothing else meanwhile: the stage times are the x axis.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "src" / "specdraft" / "recipes" / "quick.yaml"
RESULTS = ROOT / "benchmarks" / "results"


def stage(args: list[str], times: dict, name: str) -> None:
    """One `specdraft` command in a child process, its wall seconds kept under `name`."""
    print("$ specdraft " + " ".join(args), flush=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "specdraft.cli", *args], check=True)
    times[name] = round(time.perf_counter() - start, 1)


def bench_tau(model: str, drafter: Path, prompts: str, limit: int, tokens: int, k: int, out: Path,
              times: dict, name: str, data: Path) -> dict:
    """One bench round; n-gram and hybrid also draft from the point's answers (--datastore), as in the recipes."""
    if not out.is_file():
        stage(["bench", "--model", model, "--drafter", str(drafter), "--prompts", prompts, "--limit", str(limit),
               "--methods", "greedy,ngram,eagle3,hybrid", "--max-new-tokens", str(tokens), "-k", str(k),
               "--rounds", "1", "--datastore", str(data), "--out", str(out)], times, name)
    methods = json.loads(out.read_text())["methods"]
    return {m: {"tau": r["accept_len"], "per_position": r["per_position_accept"],
                "identical_to_greedy": r["identical_to_greedy"]} for m, r in methods.items() if m != "greedy"}


def natural_eval(path: Path) -> dict:
    """eval's τ on the natural-prompt store: every K up to -k, the per-position conditional rates."""
    ev = json.loads(path.read_text())
    return {"tau_by_k": ev["accept_len_by_k"], "cond_acc": ev["cond_acc"], "samples": ev["samples"]}


def extra_store(ws: Path, a, times: dict) -> Path:
    """--extra SOURCE:N: N conversations of SOURCE kept as written (no regeneration), captured once."""
    source, _, count = a.extra.rpartition(":")
    data, hidden = ws / f"extra-{source}-{count}", ws / f"extra-{source}-{count}-hidden"
    if not (data / "prepare.json").is_file():
        stage(["prepare", "--model", a.model, "--conversations", source, "--limit", count, "--max-length", "1024",
               "--out", str(data)], times, "prepare_extra")
    if not (hidden / "manifest.json").is_file():
        stage(["capture", "--model", a.model, "--prepared", str(data), "--engine", "hf", "--out", str(hidden)],
              times, "capture_extra")
    return hidden


def data_tag(a) -> str:
    """'' for greedy answers without follow-ups, else '-t0.8', '-f0.5' or both: the data folders' suffix."""
    return (f"-t{a.temperature:g}" if a.temperature else "") + (f"-f{a.follow_ups:g}" if a.follow_ups else "")


def point(ws: Path, n: int, a) -> dict:
    """One sample count: data, drafter, and its τ on three prompt sets."""
    d = data_tag(a)           # answers sampled, or with follow-ups, are other data than the greedy ones
    data, hidden, run = ws / f"data-{n}{d}", ws / f"hidden-{n}{d}", ws / f"runs/{n}{a.tag}"
    vocab = ws / f"vocab-{n}{d}{'' if a.vocab_size == 4096 else f'-{a.vocab_size}'}.safetensors"
    earlier = run / "scaling_point.json"        # a rerun keeps the stage times of what it reuses
    times: dict[str, float] = dict(json.loads(earlier.read_text()).get("seconds", {})) if earlier.is_file() else {}
    if not (data / "prepare.json").is_file():
        data.mkdir(parents=True, exist_ok=True)
        earlier = sorted(ws.glob(f"data-*{d}/regen.jsonl"))      # answers another point already wrote
        if earlier and not d and not (data / "regen.jsonl").exists():
            (data / "regen.jsonl").write_text("".join(p.read_text() for p in earlier))
        stage(["prepare", "--model", a.model, "--conversations", a.conversations, "--regenerate", "--limit", str(n),
               "--max-new-tokens", str(a.max_new_tokens), "--batch-size", str(a.regen_batch), "--engine", "hf", "--out", str(data),
               "--temperature", str(a.temperature), "--follow-ups", str(a.follow_ups)],
              times, "prepare")
    if not (hidden / "manifest.json").is_file():
        stage(["capture", "--model", a.model, "--prepared", str(data), "--engine", "hf", "--out", str(hidden)],
              times, "capture")
    if not vocab.is_file():
        stage(["vocab", "build", "--prepared", str(data), "--size", str(a.vocab_size), "--out", str(vocab)], times, "vocab")
    stores = [str(hidden)] + ([str(extra_store(ws, a, times))] if a.extra else [])
    if not (run / "best" / "config.json").is_file():
        overrides = [x for kv in a.set for x in ("--" + kv.split("=")[0].replace("_", "-"), kv.split("=", 1)[1])]
        stage(["train", "--config", str(QUICK), "--model", a.model, *[x for st in stores for x in ("--store", st)],
               "--vocab", str(vocab), "--out", str(run), "--overwrite", *overrides], times, "train")
    ev = run / "eval.json"
    if not ev.is_file():   # over both stores with --extra: the run's held-out samples are in their union
        stage(["eval", "--model", a.model, "--drafter", str(run), *[x for st in stores for x in ("--store", st)],
               "-k", str(a.k), "--out", str(ev)], times, "eval")
    nat_ev = run / "eval_natural.json"
    if a.natural_store and not nat_ev.is_file():
        stage(["eval", "--model", a.model, "--drafter", str(run), "--store", str(a.natural_store), "--split", "all",
               "-k", str(a.k), "--out", str(nat_ev)], times, "eval_natural")
    prep = json.loads((data / "prepare.json").read_text())
    regen = prep.get("regeneration") or {}
    result = {"samples": n, "trained_tokens": prep["counts"]["loss_tokens"], "truncated_turns": regen.get("truncated_turns"),
              "regen_tokens_per_s": regen["new_tokens"] / regen["seconds"] if regen.get("seconds") else None,
              "eval_tau_by_k": json.loads(ev.read_text())["accept_len_by_k"] if ev.is_file() else [],
              "natural_eval": natural_eval(nat_ev) if a.natural_store else None,
              "natural": bench_tau(a.model, run, "natural", a.natural_limit, a.bench_tokens, a.k,
                                   run / "bench_natural.json", times, "bench_natural", data) if a.natural_limit else None,
              "holdout": bench_tau(a.model, run, "builtin-holdout", a.holdout_limit, a.bench_tokens, a.k,
                                   run / "bench_holdout.json", times, "bench_holdout", data) if a.holdout_limit else None,
              "seconds": times}
    (run / "scaling_point.json").write_text(json.dumps(result, indent=2))
    return result


def taus(bench: dict | None) -> str:
    return " / ".join(f"{bench[m]['tau']:.2f}" for m in ("ngram", "eagle3", "hybrid")) if bench else "-"


def table(results: list[dict], k: int) -> str:
    rows = ["| samples | trained tokens | data+train min | eval τ (held-out samples) | eval τ (96 natural prompts) "
            "| natural bench: ngram / eagle3 / hybrid | hold-out bench: ngram / eagle3 / hybrid "
            "| natural eagle3 accept per position |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r["seconds"]
        minutes = sum(s.get(x, 0) for x in ("prepare", "capture", "vocab", "train", "prepare_extra",
                                            "capture_extra")) / 60
        by_k = r["eval_tau_by_k"]
        ev = f"{by_k[k]:.2f}" if k < len(by_k) else "-"
        nat_ev = r.get("natural_eval")
        nat_tau = f"{nat_ev['tau_by_k'][k]:.2f}" if nat_ev and k < len(nat_ev["tau_by_k"]) else "-"
        nat = r.get("natural")
        per_position = " ".join(f"{x:.2f}" for x in nat["eagle3"]["per_position"]) if nat else \
            ("cond " + " ".join(f"{x:.2f}" for x in nat_ev["cond_acc"]) if nat_ev else "-")
        rows.append(f"| {r['samples']} | {r['trained_tokens']:,} | {minutes:.1f} | {ev} | {nat_tau} | {taus(nat)} "
                    f"| {taus(r.get('holdout'))} | {per_position} |")
    return "\n".join(rows)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = [r["samples"] for r in results]
    for prompts, style in (("natural", "-"), ("holdout", "--")):
        for m, color in (("eagle3", "#3b7dd8"), ("hybrid", "#d85b3b"), ("ngram", "#888888")):
            if all(r.get(prompts) for r in results):
                ax.plot(xs, [r[prompts][m]["tau"] for r in results], style, color=color, marker="o",
                        label=f"{m} · {'natural set' if prompts == 'natural' else 'builtin hold-out'}")
    if all(r.get("natural_eval") for r in results):
        ax.plot(xs, [r["natural_eval"]["tau_by_k"][-1] for r in results], ":", color="#3b7dd8", marker="s",
                label="eagle3 · eval on the 96 natural prompts")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("regenerated samples")
    ax.set_ylabel("τ (tokens per target forward)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workspace", type=Path, default=ROOT / "ws" / "scaling")
    ap.add_argument("--model", default="default")
    ap.add_argument("--samples", default="256,512,1024,2048,4096")
    ap.add_argument("--conversations", default="builtin")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--set", action="append", default=[], help="a training setting for every point, KEY=VALUE")
    ap.add_argument("--label", default="")
    ap.add_argument("--regen-batch", type=int, default=64, help="prompts per generate() call (a GPU takes 256 and more)")
    ap.add_argument("--natural-limit", type=int, default=16)
    ap.add_argument("--holdout-limit", type=int, default=6)
    ap.add_argument("--bench-tokens", type=int, default=96)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--natural-store", type=Path, default=None,
                    help="a store captured from the natural set's prompts: eval's τ on all of them")
    ap.add_argument("--extra", default=None, help="SOURCE:N, e.g. pydoc:300: a second store of N conversations "
                    "kept as written (no regeneration) that every point also trains on")
    ap.add_argument("--temperature", type=float, default=0.0, help="prepare --temperature: sampled answers (0 = greedy)")
    ap.add_argument("--follow-ups", type=float, default=0.0, help="prepare --follow-ups: the share of self-written "
                    "conversations that get a second user turn the target writes")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the JSON, table and plot go")
    a = ap.parse_args()
    a.tag = f"-{a.label}" if a.label else ""
    results = [point(a.workspace, int(n), a) for n in a.samples.split(",")]
    name = f"data_scaling{a.tag}"
    from specdraft.api import cpu_label   # torch: only once every point is done

    import torch
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None   # where the stages ran
    report = {"cpu": cpu_label(), "device": device, "k": a.k, "conversations": a.conversations, "extra": a.extra, "settings": a.set,
              "max_new_tokens": a.max_new_tokens, "temperature": a.temperature, "follow_ups": a.follow_ups,
              "natural_prompts": a.natural_limit, "holdout_prompts": a.holdout_limit,
              "bench_tokens": a.bench_tokens, "points": results}
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / f"{name}.json").write_text(json.dumps(report, indent=2))
    text = (f"τ at K={a.k} ({report['cpu']}); natural: the first {a.natural_limit} prompts of the natural set, "
            f"hold-out: {a.holdout_limit} builtin hold-out prompts, {a.bench_tokens} new tokens each\n\n"
            + table(results, a.k) + "\n")
    (a.results / f"{name}.md").write_text(text)
    if len(results) > 1:
        plot(results, a.results / f"{name}.png")
    print(text)


if __name__ == "__main__":
    main()
