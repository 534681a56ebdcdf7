"""Drafter step overhead in the verify loop: the old drafting path against today's, in one script.

    .venv/bin/python benchmarks/drafter_step.py [--model default] [--drafter untrained:4096]
        [--rounds 7] [--repeats 20] [--threads 2] [--prompts 3] [--max-new-tokens 64]

The old path (kept below as `LegacyProposer`, the code before issue 17) grew the drafter's KV cache
with torch.cat at every step, built position and token tensors from Python lists each step, ran
fc and the decoder layer as two calls, and computed the final norm and lm_head on every caught-up
row though only the last one drafts. Today's (infer/eagle.py EagleProposer) writes into a
preallocated cache, slices a preallocated position arange, keeps the drafted id a tensor, runs the
catch-up as one call on the rows' few-row matmul path with the lm_head on the last row only.

Timed old against new, paired (calls alternate old/new, `repeats` pairs per round; the ratio is
taken per round, reported as the median of the rounds with min and max): one chain draft step, a
catch-up over 1..5 accepted positions, a whole K=4 chain round (catch-up over 2 + 3 steps). Then the
new step and chain round against the target's own 1-token step, interleaved in rounds. Then
end-to-end greedy generation with both proposers (same tokens required, tok/s ratio from
interleaved rounds). One thread by default: on a shared machine two threads wait on each other.
Writes benchmarks/results/drafter_step.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from specdraft.data.builtin_prompts import builtin_prompts
from specdraft.api import generate, load_drafter_for, load_target, prompt_ids, Sampling
from specdraft.model.common.chain import causal_chunk_mask
from specdraft.model.eagle3.proposer import EagleProposer
from specdraft.infer.speculative import Profile, cache_kwarg
from specdraft.infer.timing import busy_warning, interleaved_ms, machine_load, rotated, spread
from specdraft.infer.tree import Draft
from specdraft.model.eagle3.module import DynamicCache


class LegacyProposer:
    """The chain drafting of infer/eagle.py before issue 17, verbatim but for the tree."""

    def __init__(self, drafter, k: int = 4):
        self.drafter, self.k = drafter.eval(), k
        self.aux_layer_ids = list(drafter.config.aux_layer_ids)
        self.profile = Profile()
        self.param = next(drafter.parameters())
        self.draft_target_ids = drafter.draft_to_target(torch.arange(drafter.config.draft_vocab_size))
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache()
        self.pending = []

    def observe(self, aux) -> None:
        self.pending.append(aux)

    def run(self, target_ids, hidden, positions, mask):
        ids = torch.as_tensor(target_ids).view(1, -1)
        pos = torch.tensor([positions])
        with self.profile.timed("draft_s"):
            logits, hidden_out = self.drafter(ids, hidden.view(1, len(positions), -1), pos, mask, self.cache)
        return logits[0], hidden_out[0]

    def catch_up(self, tokens):
        aux = torch.cat(self.pending).to(self.param.dtype)
        self.pending = []
        start = len(self.cache)
        positions = list(range(start, start + aux.shape[0]))
        with self.profile.timed("draft_s"):
            hidden = self.drafter.combine_aux(aux.flatten(-2))
        logits, hidden_out = self.run(tokens[start + 1:start + 1 + len(positions)], hidden, positions,
                                      causal_chunk_mask(start, len(positions), self.param.device))
        return logits[-1], hidden_out[-1:]

    @torch.no_grad()
    def propose(self, tokens, budget, sampling, generator):
        logits, hidden = self.catch_up(tokens)
        real = len(self.cache)
        try:
            return self.draft_chain(logits, hidden, real - 1, min(self.k, budget))
        finally:
            self.cache.crop(real)

    def draft_chain(self, logits, hidden, t, k):
        tokens = []
        for step in range(k):
            tokens.append(int(self.draft_target_ids[int(logits.argmax())]))
            if step + 1 < k:
                logits, hidden = self.run([tokens[-1]], hidden, [t + step + 1], None)
                logits = logits[-1]
        return Draft.chain(tokens)


def primed(cls, drafter, target, ids: list[int]):
    """A proposer whose drafter cache holds the prompt (its real aux states from the target)."""
    proposer = cls(drafter, k=4)
    generate(target.model, ids, proposer, max_new_tokens=3)       # prefill + one round: cache = prompt
    return proposer


def step_timers(target, drafter, ids: list[int], vocab: int) -> dict:
    """name -> a callable doing one timed unit of work, leaving every cache as it found it."""
    old, new = primed(LegacyProposer, drafter, target, ids), primed(EagleProposer, drafter, target, ids)
    H = drafter.config.hidden_size
    real = len(new.cache)
    assert len(old.cache) == real
    g = torch.Generator().manual_seed(0)
    aux = {n: torch.randn(n, 3, H, generator=g) for n in range(1, 6)}
    tokens = list(range(10, 10 + real + 8))
    hidden = torch.randn(1, H, generator=g)
    token = torch.tensor(7)

    def old_step():
        old.run([7], hidden, [real], None)
        old.cache.crop(real)

    def new_step():
        new.step(token, hidden, real)
        new.cache.crop(real)

    def catch(proposer, n):
        def go():
            proposer.pending = [aux[n]]
            proposer.catch_up(tokens)
            proposer.cache.crop(real)
        return go

    def chain_round(proposer):
        def go():
            proposer.pending = [aux[2]]
            proposer.propose(tokens[:real + 3], 8, Sampling(), None)
            proposer.cache.crop(real)
        return go

    from transformers import DynamicCache

    cache = DynamicCache(config=target.model.config)
    kw = {cache_kwarg(target.model): cache}
    with torch.inference_mode():
        target.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1, **kw)

    def target_step():
        target.model(input_ids=torch.tensor([[5]]), position_ids=torch.tensor([[len(ids)]]), use_cache=True, **kw)
        cache.crop(-1)

    timers = {"step/old": old_step, "step/new": new_step, "chain_round/old": chain_round(old),
              "chain_round/new": chain_round(new), "target_step": target_step}
    for n in range(1, 6):
        timers[f"catch_up_{n}/old"], timers[f"catch_up_{n}/new"] = catch(old, n), catch(new, n)
    return timers


def end_to_end(target, drafter, prompts: list[list[int]], rounds: int, max_new: int) -> dict:
    """Greedy generation with both proposers, interleaved rounds: identical tokens, tok/s ratio."""
    procs = {"old": LegacyProposer(drafter, 4), "new": EagleProposer(drafter, 4)}
    tps = {name: [] for name in procs}
    draft_s = {name: [] for name in procs}
    tokens = {}
    for r in range(rounds):
        for name in rotated(list(procs), r):
            n, s, d = 0, 0.0, 0.0
            for i, ids in enumerate(prompts):
                out = generate(target.model, ids, procs[name], max_new)
                n, s, d = n + len(out.token_ids), s + out.seconds, d + out.profile.draft_s
                tokens.setdefault((name, i), out.token_ids)
                assert tokens[name, i] == out.token_ids
            tps[name].append(n / s)
            draft_s[name].append(d)
    same = all(tokens["old", i] == tokens["new", i] for i in range(len(prompts)))
    return {"identical_tokens": same, "tokens_per_s": {k: statistics.median(v) for k, v in tps.items()},
            "draft_s": {k: statistics.median(v) for k, v in draft_s.items()},
            "new_over_old_tokens_per_s": statistics.median(tps["new"]) / statistics.median(tps["old"]),
            "samples": {"tokens_per_s": tps, "draft_s": draft_s}}


def paired_ms(old, new, rounds: int, repeats: int) -> dict:
    """Old and new called alternately (ABAB..., who goes first alternates too), `repeats` pairs per
    round: load hits both alike. -> per-round medians, their ratio, and the overall figures."""
    old(), new()                                                                     # warm-up
    per_round = []
    for r in range(rounds):
        times = {"old": [], "new": []}
        for i in range(repeats):
            for name in (("old", "new") if (r + i) % 2 == 0 else ("new", "old")):
                fn = old if name == "old" else new
                start = time.perf_counter()
                fn()
                times[name].append(1000.0 * (time.perf_counter() - start))
        per_round.append(times)
    med = {name: [statistics.median(t[name]) for t in per_round] for name in ("old", "new")}
    ratios = [n / o for n, o in zip(med["new"], med["old"])]
    return {"old_ms": spread(med["old"]), "new_ms": spread(med["new"]),
            "old_min_ms": min(min(t["old"]) for t in per_round), "new_min_ms": min(min(t["new"]) for t in per_round),
            "new_over_old": spread(ratios), "samples": per_round}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--drafter", default="untrained:4096")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results/drafter_step.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = machine_load()
    target = load_target(args.model)
    drafter = load_drafter_for(args.drafter, target)
    prompts = [prompt_ids(target.tokenizer, [{"role": "user", "content": p}])
               for p in builtin_prompts(args.prompts, split="holdout")]
    with torch.no_grad():
        timers = step_timers(target, drafter, prompts[0], target.model.config.vocab_size)
        pairs = sorted({k.split("/")[0] for k in timers if "/" in k})
        compared = {p: paired_ms(timers[f"{p}/old"], timers[f"{p}/new"], args.rounds, args.repeats) for p in pairs}
        against = interleaved_ms({"target_step": timers["target_step"], "step/new": timers["step/new"],
                                  "chain_round/new": timers["chain_round/new"]}, args.rounds, max(3, args.repeats // 4))
        e2e = end_to_end(target, drafter, prompts, max(3, args.rounds // 2), args.max_new_tokens)
    med = {k: v["median"] for k, v in against["stats"].items()}
    result = {
        "what": __doc__.splitlines()[0], "context": len(prompts[0]), "drafter": args.drafter,
        "paired": compared, "new_over_old": {p: compared[p]["new_over_old"]["median"] for p in pairs},
        "against_target_step": {"ms": against["stats"], "step_over_target": med["step/new"] / med["target_step"],
                                "chain_round_over_target": med["chain_round/new"] / med["target_step"],
                                "samples": against["samples"]},
        "end_to_end": e2e, "rounds": args.rounds, "repeats": args.repeats,
        "load": {"start": load_start, "end": machine_load()},
        "env": {"torch": torch.__version__, "threads": args.threads, "python": platform.python_version(),
                "date": time.strftime("%Y-%m-%d")},
    }
    warning = busy_warning("drafter_step", result["load"]["start"], result["load"]["end"])
    result["warnings"] = [warning] if warning else []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for p in pairs:
        c = compared[p]
        print(f"{p:14s} old {c['old_ms']['median']:7.3f} ms  new {c['new_ms']['median']:7.3f} ms  new/old "
              f"{c['new_over_old']['median']:.3f} ({c['new_over_old']['min']:.3f}-{c['new_over_old']['max']:.3f})")
    a = result["against_target_step"]
    print(f"target 1-token step {med['target_step']:.2f} ms; draft step / target step {a['step_over_target']:.3f}; "
          f"K=4 chain round / target step {a['chain_round_over_target']:.3f}")
    print(f"end to end (greedy, K=4): new/old tok/s {e2e['new_over_old_tokens_per_s']:.3f}, draft time new/old "
          f"{e2e['draft_s']['new'] / e2e['draft_s']['old']:.3f}, identical tokens {e2e['identical_tokens']}")
    if warning:
        print(warning)


if __name__ == "__main__":
    main()
