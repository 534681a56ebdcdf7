"""`-k auto` and `--draft-stop auto` for generate and bench, and the cost measurements `plan` makes.

The chain length K and the confidence stop come from the cost model of infer/costmodel.py (the one
`specdraft plan` ranks with) fed with this machine's measured costs, the target's verify latency
for n = 1..k_max+1 tokens and one drafter step, timed in interleaved rounds, and the drafter's
per-position acceptance: its checkpoint's validation metrics (val.json, else the run's
metrics.jsonl), with a short warm-up generation measuring the positions those do not cover (TTT
trains only the first few) or all of them when there are none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from specdraft import kernels, run_layout
from specdraft.defaults import LONGEST_CHAIN
from specdraft.adapter import text_config
from specdraft.errors import SpecdraftError
from specdraft.formats.checkpoints import resolve_checkpoint
from specdraft.infer.costmodel import (ChainOption, best_option, chain_options, cheapest_rows, cond_rates_from,
                                       stop_threshold)
from specdraft.families import family_of
from specdraft.infer.speculative import Profile, TargetRunner, generate
from specdraft.infer.timing import interleaved_ms, monotonic_warning
from specdraft.io import read_json
from specdraft.metrics import load_run
from specdraft.progress import progress

K_MAX = LONGEST_CHAIN      # the longest chain -k auto considers (specdraft.defaults)
WARMUP_TOKENS = 48         # new tokens of the warm-up generation that measures acceptance
MIN_REACHED = 5            # rounds that must reach a position for its acceptance to be measured, not guessed


# ----------------------------------------------------------------------------- costs

def verify_timers(target_model, n_max: int, context: int, paths: str = "chosen") -> dict[str, Callable[[], None]]:
    """verify_n -> one round of the loop's own runner at R = n rows (TargetRunner.verify: the static
    cache, the padded shape) over a cache of `context` random tokens, which each round leaves as it
    found it. paths: the kernels the runner runs: "chosen" (what generate runs), "table" (the per-Linear
    table alone), "linear" (F.linear everywhere, as transformers runs) or "mm" (mm(W, x^T) everywhere)."""
    vocab = text_config(target_model.config).vocab_size
    g = torch.Generator().manual_seed(0)
    runner = TargetRunner(target_model, None, Profile(), rows=n_max, max_len=context + n_max + 1)
    if paths == "table" and runner.mm_flags:
        runner.mm_flags = kernels.mm_flags(runner.linears)
    elif paths in ("linear", "mm") and runner.mm_flags:
        runner.mm_flags = [tuple(paths == "mm" and rows > 0 for rows in range(len(f))) for f in runner.mm_flags]
    runner.prefill(torch.randint(0, vocab, (context,), generator=g).tolist())

    def timer(n: int) -> Callable[[], None]:
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()

        def step():
            runner.rows = n                                 # one runner, one cache: R set per timer
            runner.verify(ids, list(range(context, context + n)))
            runner.keep(context, [])                        # back to `context`
        return step
    return {f"verify_{n}": timer(n) for n in range(1, n_max + 1)}


def draft_timer(drafter, context: int, k: int = 1) -> Callable[[], None]:
    """A drafter's cost on a cache of `context` positions, timed through its family's proposer
    (infer.speculative.CostProbed.draft_probe): one chain draft step, or for a family that drafts a
    round in one forward, that forward at K = k with one new position to catch up."""
    fam = family_of(drafter)
    proposer = fam.proposer(drafter, k=k if fam.drafts_in_one_forward else 1)
    if not hasattr(proposer, "draft_probe"):
        raise SpecdraftError(f"-k auto / plan: the {fam.model_type} family's proposer has no draft_probe (the "
                             "draft cost probe, infer.speculative.CostProbed); pass -k N")
    return proposer.draft_probe(context, k)


@torch.inference_mode()
def measure_costs(target_model, drafter, n_max: int, context: int, rounds: int = 3, repeats: int = 5,
                  label: str = "plan: timing") -> dict:
    """Verify latency for n = 1..n_max and one drafter step (when `drafter`), interleaved in rounds.
    -> {"verify_ms": [median per n], "draft_ms": median | None, "stats", "samples", "order", ...}."""
    if rounds < 1:
        raise SpecdraftError(f"--rounds {rounds}: must be >= 1 (3 or more to see the spread)")
    both = kernels.measuring() and next(target_model.parameters()).device.type == "cpu"   # per path (issue 35)
    timers = verify_timers(target_model, n_max, context, "table" if both else "chosen")
    for path in ("linear", "mm") if both else ():
        timers.update({f"{path}_{n}": t for n, t in verify_timers(target_model, n_max, context, path).items()})
    if drafter is not None:
        timers["draft"] = draft_timer(drafter, context, n_max - 1)
    with progress(label, rounds, 0, "rounds") as tracker:
        timed = interleaved_ms(timers, rounds, repeats, on_round=lambda r: tracker.advance(1))
    stats = timed["stats"]
    verify = {n: stats[f"verify_{n}"]["median"] for n in range(1, n_max + 1)}
    whole = None
    if both:
        ms = {n: {"table": verify[n], **{p: stats[f"{p}_verify_{n}"]["median"] for p in ("linear", "mm")}}
              for n in verify}
        whole = {"ms": ms, "choice": kernels.record_whole_forward(kernels.target_linears(target_model), ms)}
        verify = {n: ms[n][whole["choice"][n]] for n in ms}
    return {"verify_ms": list(verify.values()),
            "draft_ms": stats["draft"]["median"] if drafter is not None else None,
            "context": context, "rounds": rounds, "repeats": repeats, "stats": stats,
            "order": timed["order"], "samples": timed["samples"], "whole_forward": whole}


PLAIN_ROWS_MAX = 4    # plain decoding's R is chosen among 1..4 rows: one real row, the rest pad rows


def recorded_curve(target_model, n_max: int) -> list[float] | None:
    """The whole-forward ms at 1..n_max rows this machine recorded for the model's Linear shapes (measure_costs, by
    -k auto and plan: the path it chose at each R), None where any is missing or damaged."""
    saved = kernels.read_cache(kernels.forward_file(kernels.target_linears(target_model)), "whole-forward timing")
    try:
        curve = [saved["ms"][str(r)][saved["choice"][str(r)]] for r in range(1, n_max + 1)]
    except (KeyError, TypeError):            # no record, a row count never measured, or a damaged one
        return None
    return curve if all(kernels.positive_ms(x) for x in curve) else None


def plain_rows(target_model, context: int) -> tuple[int, list[float]]:
    """(R, the verify curve it was read from) for plain decoding on this machine: the row count whose forward is
    cheapest (on some CPUs one row runs slower than two, the second a pad row), from the curve recorded for the
    model's shapes, measured here once where none is; R=1 off the CPU or with the kernel timing off."""
    if next(target_model.parameters()).device.type != "cpu" or not kernels.measuring():
        return 1, []
    curve = recorded_curve(target_model, PLAIN_ROWS_MAX)
    if curve is None:
        curve = measure_costs(target_model, None, PLAIN_ROWS_MAX, context, rounds=2, repeats=3,
                              label="timing plain decoding's rows")["verify_ms"]
    return cheapest_rows(curve, 1), curve


# ----------------------------------------------------------------------------- acceptance

def checkpoint_accept(spec: str | Path | None) -> tuple[list[float], str] | None:
    """The drafter's validation acceptance per position: CHECKPOINT/val.json, else the last val record
    of the run's metrics.jsonl (beside or above the checkpoint); None when there is neither."""
    if spec is None or str(spec).startswith("untrained"):
        return None
    folder = resolve_checkpoint(spec)
    if (folder / "val.json").is_file():
        rates = cond_rates_from(read_json(folder / "val.json", "validation metrics"), str(folder / "val.json"))
        if rates:
            return rates, str(folder / "val.json")
    for run in (folder, folder.parent, folder.parent.parent):
        if run_layout.metrics_file(run).is_file():
            val = load_run(run_layout.metrics_file(run)).split("val")
            rates = cond_rates_from(val[-1]) if val else None
            if rates:
                return rates, f"{run_layout.metrics_file(run)} (last val record)"
    return None


def warmup_accept(target_model, drafter, ids: list[int], k_max: int,
                  max_new_tokens: int = WARMUP_TOKENS) -> list[float | None]:
    """Conditional acceptance per position 1..k_max from one greedy generation with a k_max chain."""
    out = generate(target_model, ids, family_of(drafter).proposer(drafter, k=k_max), max_new_tokens)
    return rates_from_rounds(out.accepted, out.proposed, k_max)


def rates_from_rounds(accepted: list[int], proposed: list[int], k_max: int) -> list[float | None]:
    """Conditional acceptance a_i: of the rounds that accepted i-1 drafts and offered an i-th, the
    share that accepted it. None where fewer than MIN_REACHED rounds got there: a position the
    warm-up (nearly) never reached is unknown, not 0.00 (38 rounds, 2 reaching position 3, once
    printed "0.00" where eval measures 0.45)."""
    rates = []
    for i in range(1, k_max + 1):
        reached = [a >= i - 1 and p >= i for a, p in zip(accepted, proposed)]
        n = sum(reached)
        rates.append(sum(r and a >= i for r, a in zip(reached, accepted)) / n if n >= MIN_REACHED else None)
    return rates


def gather_accept(target_model, drafter, spec, ids: list[int], k_max: int) -> tuple[list[float], str, int]:
    """Validation rates for the positions they cover; the warm-up's for the rest (or all); positions
    neither reached carry the last measured rate forward, and the source says from where.
    -> (rates, source, positions measured)."""
    found = checkpoint_accept(spec)
    rates, source = found if found else ([], "")
    if len(rates) < k_max:
        measured = warmup_accept(target_model, drafter, ids, k_max)
        known = next((i for i, a in enumerate(measured) if a is None), len(measured))
        if known > len(rates):
            warm = f"a {WARMUP_TOKENS}-token warm-up generation"
            source = f"{source} + positions {len(rates) + 1}.. from {warm}" if rates else warm
            rates = rates + list(measured[len(rates):known])
    if not rates:
        raise SpecdraftError("-k auto: no acceptance measured (the warm-up generation reached no draft position "
                             f"in {MIN_REACHED} rounds); pass -k N")
    measured_positions = min(len(rates), k_max)
    if len(rates) < k_max:
        source += (f"; positions {len(rates) + 1}..{k_max} (~) not reached in {MIN_REACHED} rounds: "
                   f"position {len(rates)}'s rate carried forward")
        rates = rates + [rates[-1]] * (k_max - len(rates))
    return rates[:k_max], source, measured_positions


# ----------------------------------------------------------------------------- the choice

@dataclass
class AutoChoice:
    k: int
    stop: float | None
    option: ChainOption          # the cost model's prediction at k
    rates: list[float]
    source: str
    verify_ms: list[float]
    draft_ms: float
    k_auto: bool
    stop_auto: bool
    one_forward: bool = False    # the family drafts a round in one forward: draft_ms is that forward
    measured: int | None = None  # positions whose acceptance was measured; the rest carry the last one (~)

    @property
    def rows(self) -> int:
        """R, the target rows of every round at the chosen K (more than K+1 where that measured cheaper)."""
        return self.option.rows or self.k + 1

    def rows_text(self) -> str:
        return (f"; every round at R={self.rows} rows ({self.verify_ms[self.rows - 1]:.1f} ms, measured below "
                f"{self.k + 1} rows' {self.verify_ms[self.k]:.1f})" if self.rows > self.k + 1 else "")

    def line(self) -> str:
        o = self.option
        if self.k == 0:
            return self.plain_line()
        what = (f"-k auto: K={self.k}" if self.k_auto else f"K={self.k}")
        stop = f"; --draft-stop auto: {self.stop:.2f}" if self.stop_auto else ""
        return (f"{what} (expected {o.tokens_per_cycle:.2f} tokens/round, predicted {o.speedup:.2f}x over plain "
                f"decoding; acceptance {self.rates_text()} from {self.source}; "
                f"{'draft forward' if self.one_forward else 'draft step'} {self.draft_ms:.1f} ms, verify 1..{len(self.verify_ms)} tokens {self.verify_ms[0]:.1f}.."
                f"{self.verify_ms[-1]:.1f} ms){self.rows_text()}{stop}")

    def rates_text(self) -> str:
        """The rates per position, those carried forward (not measured) marked ~."""
        shown = self.measured if self.measured is not None else len(self.rates)
        return " ".join(f"{a:.2f}{'~' if i >= shown else ''}" for i, a in enumerate(self.rates))

    def plain_line(self) -> str:
        """Why -k auto decodes plainly here, in one sentence with the measured costs."""
        one = chain_options(self.rates, self.verify_ms, self.draft_ms, len(self.verify_ms) - 1, self.one_forward)[1]
        return (f"-k auto: K=0, plain decoding: no draft length pays on this machine (one draft costs a "
                f"{self.draft_ms:.1f} ms drafter {'forward' if self.one_forward else 'step'} and turns a {self.verify_ms[0]:.1f} ms 1-token forward into a "
                f"{self.verify_ms[1]:.1f} ms 2-token verify, for {one.tokens_per_cycle:.2f} tokens a round at "
                f"acceptance {self.rates[0]:.2f} from {self.source}: predicted {one.speedup:.2f}x){self.rows_text()}")

    def to_dict(self) -> dict:
        return {**asdict(self), "option": asdict(self.option), "rows": self.rows}


def decide(rates: list[float], verify_ms: list[float], draft_ms: float, k: int | None, stop_auto: bool,
           k_max: int = K_MAX, one_forward: bool = False) -> tuple[ChainOption, float | None]:
    """The cost model's choice: K (best predicted throughput among 0..k_max, or the given k; K=0 is
    plain decoding, the floor where no chain pays) and the confidence threshold (with stop_auto).
    Pure: tests check it against a brute-force sweep."""
    options = chain_options(rates, verify_ms, draft_ms, max(k_max, k or 0), one_forward)
    option = best_option(options, k_min=0) if k is None else options[k]
    return option, stop_threshold(option, draft_ms, one_forward) if stop_auto else None


def choose(target_model, drafter, spec, ids: list[int], k: int | None, stop: float | None, stop_auto: bool,
           k_max: int = K_MAX) -> AutoChoice:
    """Measure what the model needs and decide; k None = auto (never beyond what the family drafts:
    its max_draft)."""
    limit = family_of(drafter).max_draft(drafter.config)
    k_max = min(k_max, limit) if limit is not None else k_max
    n_max = max(k_max, k or 0)
    rates, source, measured = gather_accept(target_model, drafter, spec, ids, n_max)
    costs = measure_costs(target_model, drafter, n_max + 1, max(len(ids), 16), rounds=3, repeats=2,
                          label="-k auto: timing")
    one_forward = family_of(drafter).drafts_in_one_forward
    option, threshold = decide(rates, costs["verify_ms"], costs["draft_ms"], k, stop_auto, k_max, one_forward)
    stop = None if option.k == 0 else threshold if stop_auto else stop     # K=0 drafts nothing to stop
    return AutoChoice(option.k, stop, option, rates, source, costs["verify_ms"],
                      costs["draft_ms"], k is None, stop_auto, one_forward, measured)


def resolve(target, draft_model, drafter: str | None, ids: list[int], k: int | None, stop):
    """-k auto / --draft-stop auto resolved with the cost model, its choice and prediction in one
    line on stderr. -> (k, stop threshold or None, the AutoChoice or None when nothing was auto)."""
    if k is not None and stop != "auto":
        return k, stop, None
    from rich.console import Console

    choice = choose(target.model, draft_model, drafter, ids, k, None if stop == "auto" else stop,
                    stop_auto=stop == "auto")
    console = Console(stderr=True)
    console.print(choice.line(), highlight=False, soft_wrap=True, markup=False)
    noisy = monotonic_warning(choice.verify_ms)        # as plan does: a K chosen on noise says so
    if noisy:
        console.print(noisy, highlight=False, soft_wrap=True, markup=False)
    return choice.k, choice.stop, choice
