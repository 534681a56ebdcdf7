"""`specdraft plan`: choose the number of draft tokens K from measured acceptance and cost.

For a chain of K drafts with conditional acceptance a_1..a_K (a_k = P(draft k accepted | drafts
1..k-1 accepted), the cond_acc_{k-1} of training), one cycle yields
    tokens(K) = 1 + sum_{k=1..K} prod_{i<=k} a_i        (the target's own token included)
and costs
    cycle(K)  = K * draft + verify(K+1)                 (verify K drafts + the bonus position)
so throughput is tokens(K) / cycle(K). Why measure verify(n) per n: on one GPU verify is nearly
flat in n, but on 8 GPUs with tensor parallelism (the seed: ~30 ms verify, ~25 ms of it all-reduce)
the fixed cost dominates and longer chains pay off; on a CPU verify grows with n.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdraft import journal
from specdraft.analysis.probe import drafter_metrics, sample_batch
from specdraft.data.store import HiddenStore
from specdraft.errors import SpecdraftError
from specdraft.infer.bench import load_drafter_for
from specdraft.infer.speculative import cache_kwarg, few_row_matmul, target_linears
from specdraft.io import read_json, write_json
from specdraft.metrics import load_run
from specdraft.model.drafter import KVCache, causal_mask
from specdraft.progress import track
from specdraft.targets import load_target


@dataclass
class ChainOption:
    k: int                    # draft tokens per cycle
    tokens_per_cycle: float
    cycle_ms: float
    tokens_per_s: float
    speedup: float            # over plain decoding, 1 token per verify(1)
    draft_share: float        # fraction of the cycle spent drafting
    verify_share: float


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


def chain_options(rates: list[float], verify_ms: list[float], draft_ms: float, k_max: int) -> list[ChainOption]:
    """Expected throughput for K = 0..k_max; verify_ms[n-1] is the latency of verifying n tokens."""
    if not verify_ms or min(verify_ms) <= 0:
        raise SpecdraftError("--verify-ms: need positive latencies (ms) for 1..K+1 tokens")
    if draft_ms < 0:
        raise SpecdraftError("--draft-ms: must be >= 0")
    if any(not 0.0 <= a <= 1.0 for a in rates):
        raise SpecdraftError(f"--accept {rates}: acceptance rates must lie in [0, 1]")
    verify = extend(verify_ms, k_max + 1)
    plain = 1000.0 / verify[0]
    options = []
    for k in range(k_max + 1):
        tokens = expected_tokens(rates, k)
        cycle = k * draft_ms + verify[k]
        tps = 1000.0 * tokens / cycle
        options.append(ChainOption(k, tokens, cycle, tps, tps / plain, k * draft_ms / cycle, verify[k] / cycle))
    return options


# ----------------------------------------------------------------------------- acceptance sources

def cond_rates_from(obj) -> list[float] | None:
    """Conditional per-position rates from a metrics/eval/bench dict: cond_acc list or cond_acc_k keys,
    or bench's per_position_accept (P(position i accepted | offered), cumulative: a_i = r_i / r_{i-1})."""
    if not isinstance(obj, dict):
        return None
    for key in ("metrics", "acceptance", "eval", "simulated", "result"):
        if isinstance(obj.get(key), dict) and (found := cond_rates_from(obj[key])):
            return found
    methods = obj.get("methods")                     # a bench JSON: the EAGLE-3 chain's rates
    if isinstance(methods, dict):
        for name in ("eagle3", *methods):
            if (found := cond_rates_from(methods.get(name))):
                return found
    if isinstance(obj.get("cond_acc"), list):
        return [float(a) for a in obj["cond_acc"]]
    ks = sorted(int(k.rsplit("_", 1)[1]) for k in obj if k.startswith("cond_acc_") and k.rsplit("_", 1)[1].isdigit())
    if ks:
        return [float(obj[f"cond_acc_{k}"]) for k in ks]
    cumulative = obj.get("per_position_accept")
    if isinstance(cumulative, list) and cumulative:
        rates, prev = [], 1.0
        for r in map(float, cumulative):
            rates.append(r / prev if prev > 0 else 0.0)
            prev = r
        return rates
    return None


def load_accept(text: str) -> tuple[list[float], str]:
    """--accept: '0.8,0.6,0.5', a JSON file (eval/bench/probe), or a metrics.jsonl (last val record)."""
    path = Path(text)
    if not path.exists():
        try:
            return [float(x) for x in text.split(",") if x.strip()], "--accept"
        except ValueError:
            raise SpecdraftError(f"--accept {text}: neither a file nor rates such as 0.8,0.6,0.5") from None
    if path.is_dir():
        path = path / "metrics.jsonl"
    if path.suffix == ".jsonl" or path.name == "metrics.jsonl":
        val = load_run(path).split("val")
        rates = cond_rates_from(val[-1]) if val else None
        where = f"{path} (last val record)"
    else:
        rates, where = cond_rates_from(read_json(path, "acceptance JSON")), str(path)
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
    batches = (sample_batch(s["input_ids"], s["aux"].float(), s["last"].float(), s["loss_mask"])
               for s in (hs[i] for i in range(n)))
    batches = track(batches, "plan: acceptance", n, "samples", tokens=lambda b: int(b["loss_mask"].numel()))
    m = drafter_metrics(net, target.model, batches, steps)
    return [m[f"cond_acc_{k}"] for k in range(steps)]


# ----------------------------------------------------------------------------- timing

def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


@torch.inference_mode()
def measure_verify_ms(target_model, n_max: int, context: int, repeats: int = 5) -> list[float]:
    """Latency of one target forward over n = 1..n_max new tokens on top of a KV cache of `context`."""
    from transformers import DynamicCache

    linears = target_linears(target_model)
    vocab = target_model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=g)
    cache = DynamicCache(config=target_model.config)
    with_cache = {cache_kwarg(target_model): cache}
    target_model(input_ids=prompt, use_cache=True, logits_to_keep=1, **with_cache)
    out = []
    for n in track(range(1, n_max + 1), "plan: verify timing", n_max, "lengths"):
        ids = torch.randint(0, vocab, (1, n), generator=g)
        pos = torch.arange(context, context + n)[None]

        def step():
            with few_row_matmul(target_model, linears):                                         # as in generate()
                target_model(input_ids=ids, position_ids=pos, use_cache=True, **with_cache)  # logits [1, n, V]
            cache.crop(-n)                                                               # back to `context`
        out.append(_median_ms(step, repeats))
    return out


@torch.inference_mode()
def measure_draft_ms(net, context: int, repeats: int = 10) -> float:
    """Latency of one drafter step (1 token) with a drafter KV cache of `context` positions."""
    H = net.config.hidden_size
    cache = KVCache()
    hidden = torch.randn(1, context, H)                                       # [1, C, H]
    net(torch.zeros(1, context, dtype=torch.long), hidden, torch.arange(context)[None],
        causal_mask(torch.zeros(1, context, dtype=torch.long)), cache)
    tok, h, pos = torch.zeros(1, 1, dtype=torch.long), torch.randn(1, 1, H), torch.tensor([[context]])

    def step():
        net(tok, h, pos, None, cache)
        cache.crop(context)
    return _median_ms(step, repeats)


# ----------------------------------------------------------------------------- command

def run(drafter=None, model: str = "default", accept: str | None = None, data=None,
        verify_ms: list[float] | None = None, draft_ms: float | None = None, k_max: int = 8,
        context: int = 512, run: str | Path | None = None, out: str | Path | None = None,
        trust_remote_code: bool = False) -> dict:
    """What `specdraft plan` does: gather rates and latencies, rank chain lengths, save, journal."""
    if k_max < 1:
        raise SpecdraftError(f"--num-speculative-tokens {k_max}: must be >= 1")
    if draft_ms is None and drafter is None:
        raise SpecdraftError("plan: pass --draft-ms X or --drafter D (to measure a draft step)")
    if accept is not None:
        rates, accept_source = load_accept(accept)
    elif data is not None:
        if drafter is None:
            raise SpecdraftError("plan --store WS/hidden: pass --drafter D to measure its acceptance")
        rates = accept_from_store(drafter, model, data, trust_remote_code=trust_remote_code)
        accept_source = f"{data} (simulated with train.objective)"
    else:
        raise SpecdraftError("plan: pass --accept (rates, eval/bench JSON or metrics.jsonl) or --store WS/hidden")
    measured = {}
    if verify_ms is None or (draft_ms is None and drafter is not None):
        target = load_target(model, trust_remote_code=trust_remote_code)
        if verify_ms is None:
            verify_ms = measure_verify_ms(target.model, k_max + 1, context)
            measured["verify"] = f"{target.name}, context {context}, this machine"
        if draft_ms is None:
            draft_ms = measure_draft_ms(load_drafter_for(drafter, target), context)
            measured["draft"] = f"{drafter}, context {context}, this machine"
    options = chain_options(rates, verify_ms, draft_ms, k_max)
    best = max(options, key=lambda o: o.tokens_per_s)
    result = {"accept": {"cond_acc": rates, "source": accept_source,
                         "note": "positions past the measured ones repeat the last rate"},
              "verify_ms": extend(verify_ms, k_max + 1), "draft_ms": draft_ms, "measured": measured,
              "options": [asdict(o) for o in options], "best": asdict(best)}
    if out is not None:
        write_json(out, result)
    if run is not None:
        write_json(Path(run) / "plan.json", result)
        journal.record(run, "result", f"plan: best K={best.k}, {best.tokens_per_cycle:.2f} tokens/cycle, "
                       f"{best.tokens_per_s:.1f} tok/s ({best.speedup:.2f}x plain); verify {best.verify_share:.0%} "
                       f"of a cycle", source="plan")
    return result


def format_plan(result: dict) -> str:
    rates = ", ".join(f"{a:.2f}" for a in result["accept"]["cond_acc"])
    lines = [f"acceptance per position: {rates}  ({result['accept']['source']})",
             f"draft step {result['draft_ms']:.2f} ms; verify 1..{len(result['verify_ms'])} tokens: "
             + " ".join(f"{v:.1f}" for v in result["verify_ms"]) + " ms",
             f"{'K':>3s} {'tok/cycle':>9s} {'cycle ms':>9s} {'tok/s':>8s} {'speedup':>8s} {'draft':>6s} {'verify':>7s}"]
    for o in result["options"]:
        mark = "  <- best" if o["k"] == result["best"]["k"] else ""
        lines.append(f"{o['k']:3d} {o['tokens_per_cycle']:9.2f} {o['cycle_ms']:9.2f} {o['tokens_per_s']:8.1f} "
                     f"{o['speedup']:7.2f}x {o['draft_share']:6.0%} {o['verify_share']:7.0%}{mark}")
    return "\n".join(lines)
