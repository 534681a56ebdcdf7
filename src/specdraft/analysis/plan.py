"""`specdraft plan`: choose the number of draft tokens K from measured acceptance and cost.

The cost model (tokens(K) / cycle(K), infer/costmodel.py) is the one `generate`/`bench -k auto`
choose with. Latencies are measured in interleaved rounds (infer/auto.measure_costs): every round
times verify(n) for each n and one drafter step, in an order rotated per round; the plan ranks the
medians and keeps the spread and the per-round samples in its JSON.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from specdraft import journal, run_layout
from specdraft.analysis.probe import drafter_metrics, sample_batch
from specdraft.data.store import HiddenStore
from specdraft.defaults import LONGEST_CHAIN
from specdraft.errors import SpecdraftError
from specdraft.families import DEFAULT, Family, family
from specdraft.formats.checkpoints import resolve_checkpoint
from specdraft import bandwidth, kernels
from specdraft.infer.auto import checkpoint_accept, draft_timer, measure_costs
from specdraft.infer.methods import load_drafter_for
from specdraft.infer.costmodel import (ChainOption, best_option, chain_options, cond_rates_from,  # noqa: F401
                                       expected_tokens, extend)
from specdraft.infer.timing import busy_warning, interleaved_ms, machine_load, monotonic_warning
from specdraft.io import read_json, write_json
from specdraft.metrics import load_run
from specdraft.progress import track
from specdraft.targets import load_target
from specdraft.schemas.drafter import read_drafter_config


# ----------------------------------------------------------------------------- acceptance sources

def load_accept(text: str) -> tuple[list[float], str]:
    """--accept: '0.8,0.6,0.5', a JSON file (eval/bench/probe), or a metrics.jsonl (last val record)."""
    path = Path(text)
    if not path.exists():
        try:
            return [float(x) for x in text.split(",") if x.strip()], "--accept"
        except ValueError:
            raise SpecdraftError(f"--accept {text}: neither a file nor rates such as 0.8,0.6,0.5") from None
    if path.is_dir():
        path = run_layout.metrics_file(path)
    if path.suffix == ".jsonl" or path.name == run_layout.METRICS:
        val = load_run(path).split("val")
        rates = cond_rates_from(val[-1], f"{path} (last val record)") if val else None
        where = f"{path} (last val record)"
    else:
        rates, where = cond_rates_from(read_json(path, "acceptance JSON"), str(path)), str(path)
    if not rates:
        raise SpecdraftError(f"{path}: no per-position acceptance found (cond_acc list, cond_acc_k keys or "
                             "per_position_accept); pass rates with --accept 0.8,0.6,...")
    return rates, where


def accept_from_store(drafter, model: str, store: str | Path, samples: int = 64, steps: int = 7,
                      trust_remote_code: bool = False) -> list[float]:
    """cond_acc_k of the drafter on a captured hidden store (train.objective's metrics)."""
    target = load_target(model, trust_remote_code=trust_remote_code)
    net = load_drafter_for(drafter, target)
    hs = HiddenStore(store)
    n = min(samples, len(hs))
    batches = (store_sample_batch(hs[i]) for i in range(n))
    batches = track(batches, "plan: acceptance", n, "samples", tokens=lambda b: int(b["loss_mask"].numel()))
    m = drafter_metrics(net, target.model, batches, steps)
    return [m[f"cond_acc_{k}"] for k in range(steps)]


def check_max_k(drafter, k_max: int) -> int:
    """--max-k within what the drafter's family serves it for (its max_draft: a block family's draft
    slots): the default is cut to it, a larger --max-k given is refused by plan's own flag."""
    if drafter is None or str(drafter).startswith("untrained"):
        return k_max
    folder = resolve_checkpoint(drafter)
    config = read_drafter_config(folder)
    if "speculators_model_type" not in config:
        return k_max                           # another engine's layout: its family drafts any length
    fam = drafter_family(drafter)
    limit = fam.max_draft(fam.parse_config(config, str(folder)))
    if limit is None or k_max <= limit:
        return k_max
    if k_max == LONGEST_CHAIN:   # the default: the longest chain this drafter drafts
        return limit
    raise SpecdraftError(f"--max-k {k_max}: --drafter {drafter} drafts at most {limit} tokens per round "
                         f"(what its {fam.model_type} family trained it for); pass --max-k {limit} or less")


def drafter_family(spec) -> Family:
    """The family of --drafter (its config.json's speculators_model_type; another engine's layout or
    `untrained` is the default family), without loading its weights."""
    if str(spec).startswith("untrained"):
        return family(DEFAULT)
    config = read_drafter_config(resolve_checkpoint(spec))
    return family(config.get("speculators_model_type") or DEFAULT)


def store_sample_batch(sample: dict) -> dict:
    """A stored sample as a batch of one row; a compact store's teacher top-k rides along instead of last."""
    if "last" in sample:
        return sample_batch(sample["input_ids"], sample["aux"].float(), sample["last"].float(), sample["loss_mask"])
    T, K = sample["teacher_ids"].shape
    batch = sample_batch(sample["input_ids"], sample["aux"].float(), torch.zeros(T, 0), sample["loss_mask"])
    del batch["last"]
    return {**batch, "teacher_ids": sample["teacher_ids"][None], "teacher_logp": sample["teacher_logp"][None]}


# ----------------------------------------------------------------------------- command

def recorded_accept(drafter) -> tuple[list[float], str] | None:
    """The acceptance a run already measured for `drafter` (a run folder or one of its checkpoints):
    its eval.json (held-out store samples, every position), else the checkpoint's val.json or the
    run's last validation (what -k auto reads); None when it records none."""
    folder = Path(drafter)
    for run in (folder, folder.parent, folder.parent.parent):
        if (run / run_layout.EVAL).is_file() and run_layout.config_file(run).is_file():
            return load_accept(str(run / run_layout.EVAL))
    return checkpoint_accept(drafter) if folder.exists() else None


def run(drafter=None, model: str = "default", accept: str | None = None, data=None,
        verify_ms: list[float] | None = None, draft_ms: float | None = None, k_max: int = LONGEST_CHAIN,
        context: int = 512, run: str | Path | None = None, out: str | Path | None = None,
        trust_remote_code: bool = False, rounds: int = 3) -> dict:
    """What `specdraft plan` does: gather rates and latencies, rank chain lengths, save, journal."""
    if k_max < 1:
        raise SpecdraftError(f"--max-k {k_max}: must be >= 1")
    if rounds < 1:
        raise SpecdraftError(f"--rounds {rounds}: must be >= 1 (3 or more to see the spread)")
    if draft_ms is None and drafter is None:
        raise SpecdraftError("plan: pass --draft-ms X or --drafter D (to measure a draft step)")
    if accept is not None:
        rates, accept_source = load_accept(accept)
    elif data is not None:
        if drafter is None:
            raise SpecdraftError("plan --store WS/hidden: pass --drafter D to measure its acceptance")
        rates = accept_from_store(drafter, model, data, trust_remote_code=trust_remote_code)
        accept_source = f"{data} (simulated with train.objective)"
    elif drafter is not None and (recorded := recorded_accept(drafter)) is not None:
        rates, accept_source = recorded          # the run's eval.json or validation: no --accept needed
    else:
        raise SpecdraftError("plan: pass --accept (rates, eval/bench JSON or metrics.jsonl) or --store WS/hidden")
    k_max = check_max_k(drafter, k_max)
    load_start = machine_load()
    verify_ms, draft_ms, measured, timing = measure(drafter, model, verify_ms, draft_ms, k_max, context, rounds,
                                                    trust_remote_code)
    warnings = [busy_warning("plan", load_start, machine_load(), torch.get_num_threads()) if timing else None,
                monotonic_warning(verify_ms) if "verify" in measured else None]
    one_forward = drafter is not None and drafter_family(drafter).drafts_in_one_forward
    options = chain_options(rates, verify_ms, draft_ms, k_max, one_forward)
    best = best_option(options)
    result = {"accept": {"cond_acc": rates, "source": accept_source,
                         "note": "positions past the measured ones repeat the last rate"},
              "verify_ms": extend(verify_ms, k_max + 1), "draft_ms": draft_ms, "measured": measured,
              "draft_in_one_forward": one_forward,
              "options": [asdict(o) for o in options], "best": asdict(best), "timing": timing,
              "warnings": [w for w in warnings if w]}
    if out is not None:
        write_json(out, result)
    if run is not None:
        write_json(Path(run) / run_layout.PLAN, result)
        journal.record(run, "result", f"plan: best K={best.k}, {best.tokens_per_cycle:.2f} tokens/cycle, "
                       f"{best.tokens_per_s:.1f} tok/s ({best.speedup:.2f}x plain); verify {best.verify_share:.0%} "
                       f"of a cycle", source="plan")
    return result


def measure(drafter, model: str, verify_ms: list[float] | None, draft_ms: float | None, k_max: int, context: int,
            rounds: int, trust_remote_code: bool) -> tuple[list[float], float, dict, dict | None]:
    """The latencies not given, timed on this machine in `rounds` interleaved rounds.
    -> (verify_ms, draft_ms, what was measured, the timing record with spread and samples or None)."""
    if verify_ms is not None and draft_ms is not None:
        return verify_ms, draft_ms, {}, None
    target = load_target(model, trust_remote_code=trust_remote_code)
    net = load_drafter_for(drafter, target) if draft_ms is None else None
    measured = {}
    if verify_ms is None:
        timing = measure_costs(target.model, net, k_max + 1, context, rounds)
        timing["kernels"] = kernels.describe(target.model)        # the paths the verify timings ran
        timing["floor"] = bandwidth.weight_floor(target.model)      # what a bandwidth-bound forward can reach
        verify_ms = timing["verify_ms"]
        measured["verify"] = f"{target.name}, context {context}, this machine"
    else:
        with torch.inference_mode():
            timed = interleaved_ms({"draft": draft_timer(net, context, k_max)}, rounds, 10)
        timing = {"draft_ms": timed["stats"]["draft"]["median"], "context": context, "rounds": rounds,
                  "repeats": 10, **timed}
    if draft_ms is None:
        draft_ms = timing["draft_ms"]
        measured["draft"] = f"{drafter}, context {context}, this machine"
    return verify_ms, draft_ms, measured, timing


def spread_note(timing: dict | None) -> str:
    """' (median of 3 rounds; spread: draft 2.1-2.4, verify(1) 40.2-44.0 ms)' for measured latencies."""
    if not timing:
        return ""
    stats = timing["stats"]
    parts = [f"{name.replace('verify_', 'verify(') + (')' if name.startswith('verify_') else '')} "
             f"{s['min']:.1f}-{s['max']:.1f}" for name, s in stats.items() if name in ("draft", "verify_1")]
    return f"\n  (median of {timing['rounds']} interleaved rounds; min-max: {', '.join(parts)} ms)"


def format_plan(result: dict) -> str:
    rates = ", ".join(f"{a:.2f}" for a in result["accept"]["cond_acc"])
    described = (result.get("timing") or {}).get("kernels")
    lines = [kernels.format_paths(described)] if described else []
    lines += [f"acceptance per position: {rates}  ({result['accept']['source']})",
             f"draft step {result['draft_ms']:.2f} ms; verify 1..{len(result['verify_ms'])} tokens: "
             + " ".join(f"{v:.1f}" for v in result["verify_ms"]) + " ms" + spread_note(result.get("timing")),
             f"{'K':>3s} {'τ':>9s} {'R':>3s} {'cycle ms':>9s} {'tok/s':>8s} {'speedup':>8s} {'draft':>6s} {'verify':>7s}"]
    floor = (result.get("timing") or {}).get("floor")
    if floor:
        lines.insert(-1, bandwidth.floor_line(floor, result["verify_ms"]))
    whole = (result.get("timing") or {}).get("whole_forward")
    if whole:                    # the loop's verify timed on each path: F.linear, mm(W, x^T), the table's
        runs = {p: [str(n) for n, c in whole["choice"].items() if c == p] for p in ("table", "mm")}
        lines.insert(-1, "whole forward (timed per path, cached): the table's paths at "
                     f"{', '.join(runs['table']) or 'no'} rows, mm(W, x^T) everywhere at {', '.join(runs['mm']) or 'no'} "
                     "rows, F.linear everywhere elsewhere")
    for o in result["options"]:
        mark = "  <- best" if o["k"] == result["best"]["k"] else ""
        lines.append(f"{o['k']:3d} {o['tokens_per_cycle']:9.2f} {o.get('rows') or o['k'] + 1:3d} {o['cycle_ms']:9.2f} "
                     f"{o['tokens_per_s']:8.1f} "
                     f"{o['speedup']:7.2f}x {o['draft_share']:6.0%} {o['verify_share']:7.0%}{mark}")
    return "\n".join(lines)
