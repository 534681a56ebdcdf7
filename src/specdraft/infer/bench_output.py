"""What bench's report says to people: the table, the τ lines, the plot, why a method was not faster, and whether
leaving greedy's tokens was a rounding tie.

divergence() looks at the target's logits where a method's tokens left greedy's (bench calls it for each such prompt);
the rest read a finished report (bench.json), so the report and the recipe's summary use them too.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdraft.defaults import DRAFT_LENGTH
from specdraft.infer.methods import TREE, needs_drafter
from specdraft.io import atomic_path
from specdraft.metrics import by_context_text, drafter_method, tau_source

NEAR_TIE_STEPS = 4      # a divergence within this many representable steps of the logit is a rounding tie


@torch.no_grad()
def divergence(model, ids: list[int], reference: list[int], got: list[int]) -> dict:
    """Where `got` left greedy's `reference`, and by how much the target preferred greedy's token there.

    A loop that verifies K+1 tokens in one forward runs other kernel shapes than transformers'
    1-token decode: the sums inside reduce in another order. In fp32 that moves a logit by ~1e-6;
    in bf16 (8 bits of mantissa) by one representable step, and where the target's top two logits
    lie within that step the argmax can flip. `steps` is the gap in units of that step."""
    pos = next((i for i, (a, b) in enumerate(zip(reference, got)) if a != b), min(len(reference), len(got)))
    row = {"position": pos, "greedy_token": reference[pos] if pos < len(reference) else None,
           "token": got[pos] if pos < len(got) else None}
    if row["greedy_token"] is None or row["token"] is None:
        return {**row, "logit_gap": None, "steps": None, "near_tie": False}
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([ids + reference[:pos]], device=device), logits_to_keep=1).logits[0, -1]
    a, b = logits[row["greedy_token"]], logits[row["token"]]
    step = torch.finfo(logits.dtype).eps * max(abs(float(a)), abs(float(b)), 1.0)   # one step at that magnitude
    gap = float(a.float() - b.float())
    return {**row, "logit_gap": gap, "steps": abs(gap) / step, "near_tie": abs(gap) / step <= NEAR_TIE_STEPS}


def divergence_line(name: str, result: dict, num_prompts: int, dtype: str) -> str:
    """One line on a method whose tokens left greedy's: rounding ties, or a real difference."""
    rows = result["divergences"]
    ties = [d for d in rows if d["near_tie"]]
    where = ", ".join(f"token {d['position']} (gap {d['logit_gap']:.3g}, {d['steps']:.1f} steps)" if d["steps"] is not None
                      else f"token {d['position']} (length differs)" for d in rows)
    head = f"note: bench: {name} matched greedy on {num_prompts - len(rows)}/{num_prompts} prompts; it left greedy at {where}"
    if len(ties) == len(rows):
        return (f"{head}: each where the target's own top two logits lie within {NEAR_TIE_STEPS} {dtype} rounding "
                "steps, so a verify forward, which sums in another order than a 1-token decode, may pick the other "
                "(a rounding tie, not a drafting error; fp32 steps are 2^16 times finer)")
    return (f"warning: {head}: not a rounding tie (gap beyond {NEAR_TIE_STEPS} {dtype} steps): lossless decoding "
            "is broken here; please report it with this bench.json")


def why_not_faster(report: dict) -> str | None:
    """One sentence for the demo's summary and the report when a speculative method was not faster
    than greedy here (or -k auto chose plain decoding), with the measured costs; None otherwise."""
    cfg = report.get("config") or {}
    choice = cfg.get("k_auto") or {}
    if choice.get("k") == 0 and cfg.get("k_auto_line"):
        chains = [n for n in report.get("methods", {}) if needs_drafter(n) and not n.endswith(TREE)] or ["the chain"]
        return f"{', '.join(chains)} ran as plain decoding here. {cfg['k_auto_line']}"
    slower = [n for n, m in report.get("methods", {}).items() if n != "greedy" and m.get("speedup", 1.0) < 1.0]
    if not slower:
        return None
    verify, draft = choice.get("verify_ms"), choice.get("draft_ms")
    cost = (f"on this machine verifying 2 tokens costs {verify[1] / verify[0]:.2f}x a 1-token forward "
            f"({verify[0]:.1f} -> {verify[1]:.1f} ms) and a drafter step {draft:.1f} ms"
            if verify and len(verify) > 1 and draft is not None else
            "`specdraft plan` measures what a verify round and a draft step cost on this machine")
    return (f"{', '.join(slower)} {'was' if len(slower) == 1 else 'were'} slower than greedy: the tokens "
            f"accepted per round did not pay for the round ({cost}).")


def bench_table(report: dict):
    """bench's table for people: median tok/s and speedup with their min-max over the rounds, τ."""
    from rich.table import Table

    c = report["config"]
    table = Table(title=f"bench: {c['model']}, {tau_source(c.get('prompts'), c['num_prompts'])} x "
                        f"{c['max_new_tokens']} tokens, median of {c['rounds']} interleaved rounds (min-max); "
                        "τ = tokens per target forward at K drafts per round (at most K+1)")
    cut = any(r.get("drafts_cut") for r in report["methods"].values())
    over_plain = "plain" in report["methods"]
    plain_rows = report["methods"].get("plain", {}).get("rows")    # lossless: plain decoding's tokens at its R
    vs_plain = any("identical_to_plain" in r for n, r in report["methods"].items() if n != "plain")
    for col in ("method", "tokens/s", "speedup") + (("x plain",) if over_plain else ()) + (
            "τ (K)", "accept per position", "= greedy") + ((f"= plain at R={plain_rows}",) if vs_plain else ()) + (
            ("drafts cut",) if cut else ()):
        table.add_column(col)
    for name, r in report["methods"].items():
        pos = " ".join(f"{a:.2f}" for a in r["per_position_accept"]) or "-"
        tps, up = r.get("tokens_per_s_spread"), r.get("speedup_spread")
        row = [name, f"{r['tokens_per_s']:.1f}" + (f" ({tps['min']:.1f}-{tps['max']:.1f})" if tps else ""),
               f"{r['speedup']:.2f}x" + (f" ({up['min']:.2f}-{up['max']:.2f})" if up and name != "greedy" else ""),
               *((f"{r['speedup_over_plain']:.2f}x",) if over_plain else ()),
               f"{r['accept_len']:.2f} (K={method_k(name, c)})", pos,
               "yes" if r["identical_to_greedy"] else f"no ({r['prompts_identical']}/{c['num_prompts']})"]
        if vs_plain:
            same = r.get("prompts_identical_to_plain")
            row.append("-" if same is None else "yes" if r["identical_to_plain"] else f"no ({same}/{c['num_prompts']})")
        table.add_row(*row, *((str(r.get("drafts_cut", 0)),) if cut else ()))
        if r.get("fastest"):           # outside float32: plain at its own R, the "x plain" baseline
            f = r["fastest"]
            table.add_row(f"plain at R={f['rows']}", f"{f['tokens_per_s']:.1f}", f"{f['speedup']:.2f}x",
                          f"{f['speedup_over_plain']:.2f}x", *(("-",) * (len(table.columns) - 4)))
    return table


def print_report(report: dict, as_json: bool) -> None:
    """bench's stdout: the JSON, or the table and the τ-by-context line."""
    from rich.console import Console

    if as_json:
        print(json.dumps(report, indent=2))
        return
    Console().print(bench_table(report))
    for line in [context_line(report), *part_lines(report)]:
        if line:
            print(line)


def part_lines(report: dict) -> list[str]:
    """A thinking template's τ per part, per drafting method, with the mode it ran in."""
    thinking = report["config"].get("thinking") or {}
    kwargs = report["config"].get("chat_template_kwargs")
    mode = f"thinking {thinking.get('mode')}" + (f" ({json.dumps(kwargs)})" if kwargs else "")
    lines = []
    for name, r in report["methods"].items():
        parts = r.get("tau_by_part")
        if parts:
            shown = " · ".join(f"{p} {v['tau']:.2f} ({v['rounds']} rounds)" if v["tau"] is not None
                               else f"{p} - (0 rounds)" for p, v in parts.items())
            lines.append(f"{name}: τ at K={method_k(name, report['config'])} by part, {mode}: {shown}")
    return lines


def context_line(report: dict) -> str | None:
    """bench's τ-by-context line: the drafter's chain (metrics.drafter_method), else the first method
    that drafted; None when no method drafted."""
    name, result = drafter_method(report)
    if not result.get("by_context"):
        name, result = next(((n, r) for n, r in report["methods"].items() if r.get("by_context")), ("", {}))
    if not name:
        return None
    c = report["config"]
    return f"{name}: {by_context_text(result['by_context'], c.get('prompts'), c.get('num_prompts'))}"


def method_k(name: str, config: dict):
    """The draft tokens per round a bench method ran with: none for greedy and plain, the tree's
    total, n-gram's DRAFT_LENGTH where -k auto chose the chain's K, else the chain's K."""
    if name in ("greedy", "plain"):
        return 0
    if name.endswith(TREE):
        return (config.get("tree") or [None, None, "?"])[2]
    if name == "ngram" and (config.get("k_auto") or {}).get("k_auto"):
        return DRAFT_LENGTH
    return config.get("k", "?")


def time_split_lines(report: dict) -> list[str]:
    """--time-split: where each method's time went."""
    return [f"{name:12s} draft {p['draft_frac']:6.1%}  verify {p['verify_frac']:6.1%}  other {p['other_frac']:6.1%}  "
            f"({p['total_s']:.2f} s)" for name, r in report["methods"].items() if (p := r.get("profile"))]


def plot(report: dict, path: Path) -> None:
    """Bar chart of tokens/s per method, speedup over greedy on each bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["methods"])
    speeds = [report["methods"][n]["tokens_per_s"] for n in names]
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2, 3.6))
    bars = ax.bar(names, speeds, color=["#888888"] + ["#3b7dd8"] * (len(names) - 1))
    for bar, n in zip(bars, names):
        m = report["methods"][n]
        tau = "" if n in ("greedy", "plain") else f"\nτ {m['accept_len']:.2f} at K={method_k(n, report['config'])}"
        ax.annotate(f"{m['speedup']:.2f}x{tau}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("tokens / s")
    cfg = report["config"]
    ax.set_title(f"{cfg['model']} · {cfg['prompts']} ({cfg['num_prompts']}) · {cfg['max_new_tokens']} tokens", fontsize=9)
    ax.margins(y=0.25)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
