"""`specdraft bench`: every method timed over the same prompts in interleaved rounds, its speed and acceptance
summarized against transformers' greedy decoding.

run_bench checks the options before any model loads, loads the target and the drafter, and runs bench(): a warm-up
per method, then the rounds (timing.rotated), each method's result summarized over them (summarize_rounds). The
methods come from methods.py, the prompts from prompts.py; what the report says to people (the table, the lines on
departures from greedy, the plot) is bench_output.py's.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import replace

import torch

from specdraft.data.render import Chat
from specdraft.defaults import DRAFT_LENGTH
from specdraft.errors import SpecdraftError
from specdraft.families import family_of
from specdraft.infer.bench_output import divergence, divergence_line
from specdraft.infer.methods import (DEFAULT_TREE, TREE, Method, assign_rows, build_methods, check_bench_options,
                                     check_drafter_methods, compute_dtype, datastore_readers, hybrid_form,
                                     load_drafter_for, needs_drafter, shape_rows, unused_datastore_line)
from specdraft.infer.ngram import Datastore
from specdraft.infer.prompts import LONG, long_prompt_set, prompt_ids, read_prompts, target_chat
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import Generation, Profile, eos_ids_of, generate, per_position_accept
from specdraft.infer.timing import busy_warning, machine_load, rotated, spread
from specdraft.infer.tree import TreeShape
from specdraft.metrics import CONTEXT_EDGES, parse_context_buckets, rounds_by_context
from specdraft.targets import resolve_device
from specdraft.templates import parse_template_kwargs

ROUND_ROOM = 64        # cache slots kept past prompt and answer for a round's drafted rows
FASTEST_PLAIN = "plain (its own R)"    # outside float32: plain's speed run, kept under plain's "fastest"


def hf_greedy(model, ids: list[int], max_new_tokens: int, eos: set[int]) -> Generation:
    """What a user runs without us: transformers' own generate, greedy."""
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                         temperature=None, top_p=None, top_k=None,
                         eos_token_id=sorted(eos) or None, pad_token_id=(sorted(eos) or [0])[0])
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    new = out[0, len(ids):].tolist()
    return Generation(token_ids=new, seconds=seconds, target_forwards=len(new))


def run_one(model, method: Method, ids: list[int], max_new_tokens: int, eos: set[int],
            sampling: Sampling | None = None, on_tokens=None, compile: bool = False) -> Generation:
    if method.hf and (sampling is None or sampling.greedy) and on_tokens is None:
        return hf_greedy(model, ids, max_new_tokens, eos)
    sync = next(model.parameters()).device.type == "cuda"
    return generate(model, ids, method.proposer, max_new_tokens, sampling, eos, on_tokens, sync_cuda=sync,
                    rows=method.rows, compile=compile)


def summarize(name: str, runs: list[Generation], reference: list[list[int]] | None) -> dict:
    """Speed and acceptance of one pass over the prompts (acceptance is deterministic under greedy)."""
    tokens = sum(len(r.token_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    accepted = [a for r in runs for a in r.accepted]
    proposed = [p for r in runs for p in r.proposed]
    profile = Profile()
    for r in runs:
        profile.add(r.profile)
    rounds = len(accepted)
    same = [r.token_ids == ref for r, ref in zip(runs, reference)] if reference is not None else []
    return {
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "accept_len": (sum(accepted) + rounds) / rounds if rounds else 1.0,
        "per_position_accept": per_position_accept(accepted, proposed),
        "identical_to_greedy": all(same) if reference is not None else None,
        "prompts_identical": sum(same),
        "new_tokens": tokens,
        "seconds": seconds,
        "target_forwards": sum(r.target_forwards for r in runs),
        "drafts_cut": sum(r.drafts_cut for r in runs),
        "profile": profile.to_dict() if name != "greedy" else None,
    }


def summarize_rounds(name: str, rounds: list[list[Generation]], reference: list[list[int]],
                     greedy_tps: list[float]) -> dict:
    """One method over every round: acceptance from round 1 (checked equal in every round), tokens/s
    as the median of the rounds with its spread, speedup as the ratio of medians against greedy in
    the same rounds, and the per-round samples."""
    per_round = [summarize(name, runs, reference) for runs in rounds]
    result = dict(per_round[0])
    tps = [r["tokens_per_s"] for r in per_round]
    ratios = [t / g if g else 0.0 for t, g in zip(tps, greedy_tps)]
    base = statistics.median(greedy_tps)
    profile = Profile()
    for runs in rounds:
        for r in runs:
            profile.add(r.profile)
    result.update({
        "tokens_per_s": statistics.median(tps), "tokens_per_s_spread": spread(tps),
        "speedup": statistics.median(tps) / base if base else 0.0, "speedup_spread": spread(ratios),
        "identical_to_greedy": all(r["identical_to_greedy"] for r in per_round),
        "same_in_every_round": all([g.token_ids for g in runs] == [g.token_ids for g in rounds[0]]
                                   and [g.accepted for g in runs] == [g.accepted for g in rounds[0]]
                                   for runs in rounds),
        "seconds": sum(r["seconds"] for r in per_round),
        "profile": profile.to_dict() if name != "greedy" else None,
        "rounds": [{"tokens_per_s": t, "speedup": q, "seconds": r["seconds"], "new_tokens": r["new_tokens"]}
                   for t, q, r in zip(tps, ratios, per_round)],
    })
    return result


def bench(target, drafter, conversations: list[list[dict]], method_names: list[str], max_new_tokens: int,
          k: int, tree: TreeShape | None, ngram_max: int = 3, ngram_min: int = 1, progress=None,
          rounds: int = 3, draft_stop: float | None = None, ngram_k: int | None = None,
          rows: int | None = None, context_edges=CONTEXT_EDGES, datastore: Datastore | None = None,
          chain_rows: int | None = None, plain_rows: int | None = None, compile: bool = False,
          hybrid_tree: bool = True, chat: Chat | None = None, fastest_plain_rows: int | None = None) -> dict:
    """Same prompts for every method, batch 1, one warm-up generation per method first (which compiles, under
    `compile`); then `rounds` rounds, each running every method on every prompt, the order rotated per round.
    rows: every loop method at that row count; chain_rows, plain_rows: the drafter's chain's and plain
    decoding's (assign_rows). Plain decoding is the reference of every method at its R (the same tokens
    in any dtype: `identical_to_plain`), and is added to the methods when rows are given, or when
    chain_rows are and the target computes in a dtype other than float32 (where transformers' greedy
    sums in other orders); there `fastest_plain_rows` (shape_rows) also runs plain decoding at its own R, and
    every "x plain" is against the faster of the two (plain's `fastest`). `chat`: the template with its
    arguments (default: none), which renders the prompts and splits τ into reasoning and answer (tau_by_part)."""
    if rounds < 1:
        raise SpecdraftError(f"--rounds {rounds}: must be >= 1 (3 or more to see the spread)")
    model, tok = target.model, target.tokenizer
    eos = eos_ids_of(model, tok)
    chat = chat or Chat(tok, sorted(eos))
    prompts = [prompt_ids(tok, c, chat.kwargs) for c in conversations]
    names = bench_names(method_names, rows, chain_rows, next(model.parameters()).dtype != torch.float32)
    methods = build_methods(names, drafter, k, tree, ngram_max, ngram_min, draft_stop, ngram_k, datastore, hybrid_tree)
    assign_rows(methods, rows, chain_rows, plain_rows)
    if fastest_plain_rows and "plain" in names and not rows:          # the speed baseline at plain's own R
        methods.append(replace(next(m for m in methods if m.name == "plain"), name=FASTEST_PLAIN,
                               rows=fastest_plain_rows))
    runs, order, (load_start, load_end) = run_rounds(model, methods, prompts, rounds, max_new_tokens, eos, compile,
                                                     progress)
    reference = [g.token_ids for g in runs["greedy"][0]]
    greedy_tps = [summarize("greedy", rs, None)["tokens_per_s"] for rs in runs["greedy"]]
    results = {n: summarize_rounds(n, runs[n], reference, greedy_tps) for n in names}
    for m in methods:
        if m.name in results:
            results[m.name]["rows"] = m.rows
    if "plain" in results:             # lossless against this loop's own plain decoding, any dtype
        compare_with_plain(results, runs)
    for n, r in results.items():
        if r["identical_to_greedy"] is False:
            r["divergences"] = [divergence(model, ids, ref, g.token_ids)
                                for ids, ref, g in zip(prompts, reference, runs[n][0]) if g.token_ids != ref]
    for n, r in results.items():
        if n not in ("greedy", "plain"):
            k_n = tree.total if n.endswith(TREE) and tree else (ngram_k or k) if n == "ngram" else k
            r.update(round_sections(runs[n][0], prompts, chat, context_edges, k_n))
    if "plain" in results:
        over_plain(results, runs, reference, greedy_tps, fastest_plain_rows)
    warnings = [w for w in [busy_warning("bench", load_start, load_end, torch.get_num_threads())] if w]
    warnings += [divergence_line(n, r, len(prompts), str(next(model.parameters()).dtype).replace("torch.", ""))
                 for n, r in results.items() if r.get("divergences")]
    warnings += [f"warning: bench: {n} gave different tokens or acceptance in different rounds (greedy decoding "
                 "should be deterministic)" for n, r in results.items() if not r["same_in_every_round"]]
    return {"methods": results, "rounds": rounds, "order": order,
            "load": {"start": load_start, "end": load_end, "cores": os.cpu_count()}, "warnings": warnings}


def run_rounds(model, methods: list[Method], prompts: list[list[int]], rounds: int, max_new_tokens: int,
               eos: set[int], compile: bool, progress) -> tuple[dict[str, list[list[Generation]]], list, tuple]:
    """One warm-up generation per method, then `rounds` rounds of every method on every prompt, the order rotated
    per round: (runs per method and round, the orders, the machine's load before and after)."""
    for m in methods:                                                 # warm-up
        run_one(model, m, prompts[0], min(8, max_new_tokens), eos, compile=compile)
    load_start = machine_load()
    runs: dict[str, list[list[Generation]]] = {m.name: [] for m in methods}
    order = []
    for r in range(rounds):
        order.append([m.name for m in rotated(methods, r)])
        for m in rotated(methods, r):
            runs[m.name].append([])
            for ids in prompts:
                runs[m.name][-1].append(run_one(model, m, ids, max_new_tokens, eos, compile=compile))
                if progress:
                    progress(m.name)
    return runs, order, (load_start, machine_load())


def over_plain(results: dict, runs: dict, reference: list[list[int]], greedy_tps: list[float],
               fastest_rows: int | None) -> None:
    """What drafting adds over the same loop with no drafter: each method's `speedup_over_plain`, against plain
    decoding's faster run (outside float32 also its own-R run, kept as plain's `fastest`)."""
    own = summarize_rounds(FASTEST_PLAIN, runs[FASTEST_PLAIN], reference, greedy_tps) if FASTEST_PLAIN in runs else None
    plain = max(results["plain"]["tokens_per_s"], own["tokens_per_s"] if own else 0.0)
    for r in results.values():
        r["speedup_over_plain"] = r["tokens_per_s"] / plain if plain else 0.0
    if own:
        results["plain"]["fastest"] = {"rows": fastest_rows, "tokens_per_s": own["tokens_per_s"],
                                       "tokens_per_s_spread": own["tokens_per_s_spread"], "speedup": own["speedup"],
                                       "speedup_over_plain": own["tokens_per_s"] / plain if plain else 0.0}


def round_sections(gens: list[Generation], prompts: list[list[int]], chat: Chat, context_edges, k) -> dict:
    """A drafting method's τ by context length (every verify round of round 1 in its bucket) and, for a
    thinking template, by part (tau_by_part)."""
    return {"by_context": rounds_by_context([c for g in gens for c in g.contexts], [a for g in gens for a in g.accepted],
                                            context_edges, k),
            "tau_by_part": tau_by_part(chat, prompts, gens)}


def tau_by_part(chat: Chat, prompts: list[list[int]], gens: list[Generation]) -> dict | None:
    """A thinking template's τ split: the verify rounds that draft reasoning (through </think>, or the
    harmony analysis message) and those that draft the answer after it; None for other templates."""
    if chat.style is None:
        return None
    parts = {"reasoning": [0, 0], "answer": [0, 0]}            # rounds, drafts accepted
    for ids, g in zip(prompts, gens):
        cut = chat.reasoning_length(ids, g.token_ids)
        for context, accepted in zip(g.contexts, g.accepted):
            part = parts["reasoning" if context - len(ids) < cut else "answer"]
            part[0] += 1
            part[1] += accepted
    return {name: {"tau": (a + r) / r if r else None, "rounds": r} for name, (r, a) in parts.items()}


def compare_with_plain(results: dict, runs: dict) -> None:
    """Each method's round-1 tokens against plain decoding's at the same R: identical_to_plain, and on how
    many prompts (a chain is bit-identical in any dtype, a tree only where its sums fall alike). A
    method at another R is not compared: its sums differ by design."""
    plain_tokens = [g.token_ids for g in runs["plain"][0]]
    for n, r in results.items():
        if n != "greedy" and r["rows"] == results["plain"]["rows"]:
            same = [g.token_ids == t for g, t in zip(runs[n][0], plain_tokens)]
            r["identical_to_plain"], r["prompts_identical_to_plain"] = all(same), sum(same)


def environment(device: str, dtype: str) -> dict:
    import transformers

    return {"device": device, "dtype": dtype, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads()}


def plain_rows_of(target, names: list[str], choice, ids: list[int], rows: int | None, compile: bool) -> int | None:
    """Plain decoding's own R (auto.plain_rows) where bench runs it without --verify-rows, -k auto or --compile."""
    from specdraft.infer.auto import plain_rows

    if "plain" not in names or rows is not None or choice is not None or compile:
        return None
    return plain_rows(target.model, len(ids))[0]


def bench_names(method_names: list[str], rows: int | None, chain_rows: int | None, not_fp32: bool) -> list[str]:
    """The methods bench() reports: greedy first (the reference), and plain at the same rows where rows are given,
    or chain rows outside float32 (plain is then the lossless reference)."""
    names = ["greedy"] + [n for n in method_names if n != "greedy"]
    if (rows or (chain_rows and not_fp32)) and "plain" not in names:
        names.append("plain")
    return names


def methods_run(names: list[str], shapes: dict, rows: int | None, dtype: str) -> int:
    """How many methods bench() runs per prompt and round (its progress total): bench_names, and plain's own-R run
    outside float32."""
    reported = bench_names(names, rows, shapes["chain_rows"], dtype != "float32")
    return len(set(reported)) + bool(shapes.get("fastest_plain_rows") and "plain" in reported and not rows)


def run_bench(model: str, drafter: str | None, prompts: str, methods: str, max_new_tokens: int,
              k_option: int | str | None, stop: float | str | None, rounds: int, tree: str | None,
              ngram: tuple[int, int], limit: int | None, device: str, dtype: str, trust_remote_code: bool,
              rows: int | None = None, context_buckets: str | None = None, max_context: int | None = None,
              datastore: str | None = None, compile: bool = False, template_kwargs: str | dict | None = None) -> dict:
    """`specdraft bench`: the options checked before the model loads, then bench() over the prompts.
    `template_kwargs`: --chat-template-kwargs, the prompts rendered with them, τ reported for the thinking
    mode they give (on, off; none for a template without reasoning) and split into reasoning and answer.
    `k_option`, `stop`: -k and --draft-stop as the CLI parsed them (defaults.draft_length_option,
    parse_draft_stop); -k unset is auto for a drafter's chain and DRAFT_LENGTH for n-gram and the tree."""
    from rich.console import Console

    from specdraft.defaults import draft_length
    from specdraft.infer.auto import resolve
    from specdraft.progress import progress
    from specdraft.targets import DTYPES, load_target

    kwargs = parse_template_kwargs(template_kwargs)
    names = [n.strip() for n in methods.split(",") if n.strip()]
    chains = [n for n in names if needs_drafter(n) and not n.endswith(TREE)]   # -k auto applies to these
    k = draft_length(k_option, default_auto=bool(chains))
    check_bench_options(names, methods, chains, k, k_option, stop, tree, dtype, datastore, prompts, max_context)
    shape = TreeShape.parse(tree or DEFAULT_TREE)
    edges = parse_context_buckets(context_buckets)
    if drafter is None:
        check_drafter_methods(names, None)             # a drafter method without --drafter: before any load
    conversations = read_prompts(prompts, limit) if prompts != LONG else []
    dev = resolve_device(device)
    asked, dtype = dtype, compute_dtype(dtype, model, dev, trust_remote_code)
    target = load_target(model, dtype=dtype, device=dev, trust_remote_code=trust_remote_code)
    chat = target_chat(target, kwargs)
    if prompts == LONG:
        conversations = long_prompt_set(target, limit, max_context, max_new_tokens, rows or ROUND_ROOM)
    draft_model = (load_drafter_for(drafter, target, dev, DTYPES[dtype]) if any(map(needs_drafter, names)) else None)
    if draft_model is not None:
        check_drafter_methods(names, draft_model)      # --methods FAMILY for a drafter of that family
    answers = Datastore.from_prepared(datastore, target) if datastore else None
    first = prompt_ids(target.tokenizer, conversations[0], kwargs)   # -k auto and the hybrid's form time at its length
    k, stop, choice = resolve(target, draft_model, drafter, first, k, stop)
    ngram_k = DRAFT_LENGTH if choice and choice.k_auto else None
    form = hybrid_form(target, names, choice, k, ngram_k or k, first)
    plain = plain_rows_of(target, names, choice, first, rows, compile)
    shapes = shape_rows(choice, k, dtype, plain)
    total = len(conversations) * rounds * methods_run(names, shapes, rows, dtype)
    with progress("bench", total, 0, "runs", console=Console(stderr=True)) as tracker:
        report = bench(target, draft_model, conversations, names, max_new_tokens, k, shape, ngram[1], ngram[0],
                       progress=lambda name: tracker.advance(1, method=name), rounds=rounds, draft_stop=stop,
                       ngram_k=ngram_k, rows=rows, context_edges=edges, datastore=answers, compile=compile,
                       hybrid_tree=form != "switch", chat=chat, **shapes)
    unused = unused_datastore_line(names, form) if answers else None
    report["warnings"] = [*report.get("warnings", []), *([unused] if unused else [])]
    report["config"] = {"model": target.name, "target_fingerprint": target.identity.get("fingerprint"), "drafter": drafter, "prompts": prompts,
                        "num_prompts": len(conversations), "max_new_tokens": max_new_tokens, "k": k,
                        "k_auto": choice.to_dict() if choice else None, "k_auto_line": choice.line() if choice else None,
                        "draft_stop": stop, "rounds": rounds, "verify_rows": rows, "context_buckets": list(edges),
                        "compile": compile, "hybrid_form": form,
                        "family": family_of(draft_model).model_type if draft_model is not None else None,
                        "tree": [shape.depth, shape.topk, shape.total] if any(n.endswith(TREE) for n in names)
                        else None,
                        "ngram": list(ngram), "datastore": answers and {**answers.describe(datastore),
                                                                        "read_by": datastore_readers(names, form)},
                        "chat_template_kwargs": kwargs, "thinking": {"style": chat.style, "mode": chat.mode()},
                        **environment(dev, dtype), "dtype_asked": asked}
    return report
