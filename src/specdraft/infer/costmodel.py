"""The draft-length cost model that `specdraft plan`, `generate/bench -k auto` and `--draft-stop auto`
share (one function ranks the options, so a choice made in the loop is the one plan prints).

For a chain of K drafts with conditional acceptance a_1..a_K (a_k = P(draft k accepted | drafts
1..k-1 accepted), the cond_acc_{k-1} of training), one cycle yields
    tokens(K) = 1 + sum_{k=1..K} prod_{i<=k} a_i        (the target's own token included)
and costs
    cycle(K)  = K * draft + verify(K+1)                 (verify K drafts + the bonus position)
A family that drafts a round in one forward (`one_forward`: its Family.drafts_in_one_forward) pays its draft once:
    cycle(K)  = draft + verify(K+1)   (K >= 1; `draft` then is one such forward, timed at the largest K)
so throughput is tokens(K) / cycle(K). A round of K drafts may also run padded to R > K+1 rows (the
loop's one forward shape, issue 35): where the measured curve is lower at R (one row that two rows do
faster), verify(K+1) above is the least verify(R) over R = K+1..the longest measured, and the option
records that R. Why measure verify(n) per n: on one GPU verify is nearly
flat in n, but on 8 GPUs with tensor parallelism (the seed: ~30 ms verify, ~25 ms of it all-reduce)
the fixed cost dominates and longer chains pay off; on a CPU verify grows with n.

The confidence stop asks the same model a marginal question: one more draft position costs a
drafter step (the round's R rows are run however early the chain stops), and earns a token (worth the time a token costs at the
chosen K) with the probability that the chain so far is accepted; drafting stops when the
drafter's own estimate of that probability falls below cost / value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specdraft.errors import SpecdraftError
from specdraft.metrics import drafter_method


@dataclass
class ChainOption:
    k: int                    # draft tokens per cycle
    tokens_per_cycle: float
    cycle_ms: float
    tokens_per_s: float
    speedup: float            # over plain decoding, 1 token per round at its cheapest R
    draft_share: float        # fraction of the cycle spent drafting
    verify_share: float
    rows: int = 0             # R: the target rows every round runs at (K+1, or more where that measured cheaper)


def expected_tokens(rates: list[float], k: int) -> float:
    """1 + sum_{j=1..k} prod_{i<=j} a_i; positions past the measured ones repeat the last rate."""
    total, prod = 1.0, 1.0
    for j in range(k):
        prod *= rates[min(j, len(rates) - 1)] if rates else 0.0
        total += prod
    return total


def extend(values: list[float], n: int) -> list[float]:
    """values[0..n-1], repeating the last one (a single verify time means flat in n)."""
    return [values[min(i, len(values) - 1)] for i in range(n)]


def cheapest_rows(verify_ms: list[float], need: int) -> int:
    """R >= need with the least measured verify time (ties: the fewer rows); `need` past the measured
    row counts runs at `need`."""
    candidates = range(need, max(need, len(verify_ms)) + 1)
    return min(candidates, key=lambda r: (verify_ms[min(r, len(verify_ms)) - 1], r))


def draft_cost(draft_ms: float, k: int, one_forward: bool = False) -> float:
    """A round's drafting time at K: K steps of a chain, or one forward (nothing at K=0)."""
    return (draft_ms if k > 0 else 0.0) if one_forward else k * draft_ms


def chain_options(rates: list[float], verify_ms: list[float], draft_ms: float, k_max: int,
                  one_forward: bool = False) -> list[ChainOption]:
    """Expected throughput for K = 0..k_max; verify_ms[n-1] is the latency of verifying n tokens (a
    round at K runs at cheapest_rows(verify_ms, K+1))."""
    if not verify_ms or min(verify_ms) <= 0:
        raise SpecdraftError("--verify-ms: need positive latencies (ms) for 1..K+1 tokens")
    if draft_ms < 0:
        raise SpecdraftError("--draft-ms: must be >= 0")
    if any(not 0.0 <= a <= 1.0 for a in rates):
        raise SpecdraftError(f"--accept {rates}: acceptance rates must lie in [0, 1]")
    verify = extend(verify_ms, k_max + 1)
    plain = 1000.0 / min(verify)            # plain decoding at its own cheapest R
    options = []
    for k in range(k_max + 1):
        rows = cheapest_rows(verify, k + 1)
        tokens = expected_tokens(rates, k)
        drafting = draft_cost(draft_ms, k, one_forward)
        cycle = drafting + verify[rows - 1]
        tps = 1000.0 * tokens / cycle
        options.append(ChainOption(k, tokens, cycle, tps, tps / plain, drafting / cycle, verify[rows - 1] / cycle,
                                   rows))
    return options


def best_option(options: list[ChainOption], k_min: int = 0) -> ChainOption:
    """The highest predicted throughput among K >= k_min (ties: the shorter chain)."""
    candidates = [o for o in options if o.k >= k_min]
    if not candidates:
        raise SpecdraftError(f"no chain length >= {k_min} to choose from")
    return max(candidates, key=lambda o: (o.tokens_per_s, -o.k))


def stop_threshold(option: ChainOption, draft_ms: float, one_forward: bool = False) -> float:
    """--draft-stop auto: the chain confidence below which one more draft costs more than it earns.

    Every round runs the target at the option's R rows however early the chain stops (the loop's one
    forward shape), so one more position costs only a drafter step; it earns one token, worth what a
    token costs at `option` (cycle_ms / tokens_per_cycle), with probability = the chain's confidence. A
    one-forward family has drafted every position already: nothing is saved, never stop."""
    value_ms = option.cycle_ms / option.tokens_per_cycle
    step_ms = 0.0 if one_forward else draft_ms
    return min(max(step_ms / value_ms, 0.0), 1.0)


# ----------------------------------------------------------------------------- acceptance sources

def cond_rates_from(obj, where: str = "rates", prefix: str = "") -> list[float] | None:
    """Conditional per-position rates from a metrics/eval/bench dict: cond_acc list or cond_acc_k keys,
    or bench's per_position_accept (P(position i accepted | offered), cumulative: a_i = r_i / r_{i-1}).
    A rate that is not a number is one line naming `where` (the file) and the field."""
    if not isinstance(obj, dict):
        return None
    for key in ("metrics", "acceptance", "eval", "simulated", "result"):
        if isinstance(obj.get(key), dict) and (found := cond_rates_from(obj[key], where, f"{prefix}{key}.")):
            return found
    methods = obj.get("methods")                     # a bench JSON: the drafter's chain's rates first
    if isinstance(methods, dict):
        for name in (drafter_method(obj)[0], *methods):
            if (found := cond_rates_from(methods.get(name), where, f"{prefix}methods.{name}.")):
                return found
    if isinstance(obj.get("cond_acc"), list):
        return [_rate(a, f"{prefix}cond_acc.{i}", where) for i, a in enumerate(obj["cond_acc"])]
    ks = sorted(int(k.rsplit("_", 1)[1]) for k in obj if k.startswith("cond_acc_") and k.rsplit("_", 1)[1].isdigit())
    if ks:
        return [_rate(obj[f"cond_acc_{k}"], f"{prefix}cond_acc_{k}", where) for k in ks]
    cumulative = obj.get("per_position_accept")
    if isinstance(cumulative, list) and cumulative:
        return conditional([_rate(r, f"{prefix}per_position_accept.{i}", where) for i, r in enumerate(cumulative)])
    return None


def _rate(value, field: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        shown = json.dumps(value)[:60] if not isinstance(value, (dict, list)) else type(value).__name__
        raise SpecdraftError(f"{where}: field '{field}' is {shown}, expected a number (an acceptance rate "
                             "0..1); fix the file or pass rates with --accept 0.8,0.6,...")
    return float(value)


def conditional(cumulative: list[float]) -> list[float]:
    """Per-position acceptance over rounds that offered it (r_i) -> conditional a_i = r_i / r_{i-1}."""
    rates, prev = [], 1.0
    for r in map(float, cumulative):
        rates.append(min(r / prev, 1.0) if prev > 0 else 0.0)
        prev = r
    return rates
