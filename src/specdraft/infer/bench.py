"""`specdraft generate` and `specdraft bench`: load the target and the drafter, build proposers,
run speculative generation against plain greedy decoding, report speed and acceptance."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft.data.builtin_prompts import builtin_prompts
from specdraft.data.render import Chat, end_of_turn_ids
from specdraft.templates import check_template_kwargs, parse_template_kwargs
from specdraft.defaults import DRAFT_LENGTH, check_compute_dtype
from specdraft.adapter import text_config
from specdraft.errors import SpecdraftError
from specdraft.formats.checkpoints import load_drafter, resolve_checkpoint
from specdraft.infer.hybrid import HYBRID, TREE_PAYS, HybridProposer, tree_pays
from specdraft.infer.ngram import Datastore, NgramProposer
from specdraft.infer.sampling import Sampling
from specdraft.infer.tree import TreeShape
from specdraft.infer.speculative import (Generation, Profile, eos_ids_of, generate, per_position_accept,
                                        checked_rows)
from specdraft.infer.timing import busy_warning, machine_load, rotated, spread
from specdraft.io import atomic_path
from specdraft.metrics import (CONTEXT_EDGES, by_context_text, drafter_method, parse_context_buckets,
                               rounds_by_context, tau_source)
from specdraft import families
from specdraft.families import family, family_of
from specdraft.targets import default_aux_layers, resolve_device

# greedy: transformers' generate (what a user runs without us; every speedup is against it).
# plain: specdraft's own loop with no drafter, on the kernel paths measured for this machine
# (kernels.py): a drafter's speedup over plain is what the drafts alone bring.
# Then a drafter's own chain under its family's name, FAMILY-tree where the family drafts trees, and hybrid:
# the drafter's chain and the n-gram continuation verified together (infer/hybrid.py), any family.
BASE_METHODS = ("greedy", "plain", "ngram")
TREE = "-tree"


HYBRID_TREE = HYBRID + TREE   # the drafter's tree with the n-gram continuation grafted on (greedy)


def all_methods() -> tuple[str, ...]:
    return (*BASE_METHODS, *families.names(), *(n + TREE for n in families.names() if family(n).tree), HYBRID,
            HYBRID_TREE)


def needs_drafter(name: str) -> bool:
    return name in (HYBRID, HYBRID_TREE) or name.removesuffix(TREE) in families.names()


def check_drafter_methods(names: list[str], drafter, flag: str = "--methods") -> None:
    """A drafter method names the drafter's family: --methods FAMILY runs a drafter of that family
    (hybrid takes a drafter of any family). `flag`: the option the user typed (bench's --methods,
    generate's --method)."""
    wanted = [n for n in names if needs_drafter(n)]
    if wanted and drafter is None:
        raise SpecdraftError(f"{flag} {wanted[0]}: needs --drafter (a checkpoint, a run folder, or untrained)")
    for name in (n for n in wanted if n != HYBRID):
        have = family_of(drafter).model_type
        if name == HYBRID_TREE and not family_of(drafter).tree:
            raise SpecdraftError(f"{flag} {name}: the --drafter is a {have} drafter, which drafts no tree; "
                                 f"name it {flag} {HYBRID} (its chain with the n-gram continuation)")
        if name != HYBRID_TREE and name.removesuffix(TREE) != have:
            tree = TREE if name.endswith(TREE) else ""
            raise SpecdraftError(f"{flag} {name}: the --drafter is a {have} drafter; name it {flag} {have}{tree}")
DEFAULT_TREE = "4,4,16"
UNTRAINED = "untrained"


def untrained_drafter(target_model, draft_vocab_size: int = 8192, seed: int = 0, verifier: str = "",
                      model_type: str = families.DEFAULT):
    """Random drafter over the first N target ids (timing only: it is almost never accepted)."""
    from types import SimpleNamespace

    tc = text_config(target_model.config)
    n = min(draft_vocab_size, tc.vocab_size)
    torch.manual_seed(seed)
    fam = family(model_type)
    drafter = fam.build(fam.new_config(target_model.config, n, default_aux_layers(tc.num_hidden_layers), verifier))
    t2d = torch.zeros(tc.vocab_size, dtype=torch.bool)
    t2d[:n] = True
    fam.init_from_target(drafter, SimpleNamespace(model=target_model), torch.zeros(n, dtype=torch.long), t2d)
    return drafter.eval()


def check_drafter_fits(drafter, target_model, target_name: str = "") -> list[str]:
    """Raise on shape mismatches; return warnings (e.g. a different verifier name)."""
    cfg, tc = drafter.config, text_config(target_model.config)
    where = f"--drafter (verifier {cfg.verifier or 'unnamed'})"
    if cfg.hidden_size != tc.hidden_size:
        raise SpecdraftError(f"{where}: hidden size {cfg.hidden_size} != target's {tc.hidden_size}; "
                             "this drafter was trained for another target")
    if cfg.vocab_size != tc.vocab_size:
        raise SpecdraftError(f"{where}: vocab size {cfg.vocab_size} != target's {tc.vocab_size}; "
                             "this drafter was trained for another target")
    if not all(0 <= l < tc.num_hidden_layers for l in cfg.aux_layer_ids):
        raise SpecdraftError(f"{where}: aux layer ids {cfg.aux_layer_ids} do not fit a "
                             f"{tc.num_hidden_layers}-layer target")
    warnings = []
    if cfg.verifier and target_name and cfg.verifier != target_name:
        warnings.append(f"drafter was trained for {cfg.verifier}, running against {target_name}")
    return warnings


def load_drafter_for(spec: str | Path, target, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """--drafter: a checkpoint folder, a run folder (best/ or newest epoch), or `untrained[:N]`,
    checked against `target` (shapes, aux layers; a warning for another verifier name)."""
    spec = str(spec)
    if spec == UNTRAINED or spec.startswith(UNTRAINED + ":"):
        try:
            n = int(spec.split(":", 1)[1]) if ":" in spec else 8192
        except ValueError:
            raise SpecdraftError(f"--drafter {spec}: expected untrained or untrained:N (draft vocab size)") from None
        if n < 1:
            raise SpecdraftError(f"--drafter {spec}: the draft vocab size N must be >= 1, e.g. untrained:8192")
        drafter = untrained_drafter(target.model, n, verifier=target.name)
    else:
        drafter = load_drafter(resolve_checkpoint(spec), target_model=target.model)  # embeds if shipped without
    for warning in check_drafter_fits(drafter, target.model, target.name):
        print(f"warning: {warning}", file=sys.stderr)
    return drafter.to(device=device, dtype=dtype).eval()


def prompt_ids(tokenizer, messages: list[dict], template_kwargs: dict | None = None) -> list[int]:
    """Chat template (with its arguments, --chat-template-kwargs) and the generation prompt; plain text
    when the tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None):
        return Chat(tokenizer, [], template_kwargs or {}).prompt_ids(messages)
    return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]


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


NATURAL = "natural"
NATURAL_FILE = Path(__file__).resolve().parent.parent / "data" / "natural.jsonl"
PROMPT_SETS = ("builtin-holdout", NATURAL)
LONG = "long"          # bench only: built for the target's tokenizer and context (data/documents.py)
LONG_PROMPTS = 8       # its size without --limit
ROUND_ROOM = 64        # cache slots kept past prompt and answer for a round's drafted rows


def long_prompt_set(target, limit: int | None, max_context: int | None, max_new_tokens: int,
                    rows: int) -> list[list[dict]]:
    """`--prompts long`: conversations over long documents (data/documents.py) whose prompts spread up
    to the target's context (or --max-context, at most that) less the answer and a round's rows."""
    from specdraft.data.documents import long_prompts

    context = getattr(target.model.config, "max_position_embeddings", None) or max_context or 2048
    if max_context is not None and max_context > context:
        raise SpecdraftError(f"--max-context {max_context}: {target.name} attends over {context} tokens at most; "
                             f"pass --max-context {context} or less")
    tok = target.tokenizer

    def count_tokens(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return long_prompts(limit or LONG_PROMPTS, (max_context or context) - max_new_tokens - rows, count_tokens)


def prompt_set_path(source: str) -> Path:
    """--prompts NAME: `natural` is the hand-written set shipped with specdraft; anything else a file."""
    return NATURAL_FILE if source == NATURAL else Path(source)


@dataclass
class PromptRow:
    """One prompt of a prompt set: the messages to prompt with and the line's `category` (if any)."""
    messages: list[dict]
    category: str | None = None


def read_prompts(source: str, limit: int | None = None) -> list[list[dict]]:
    """`builtin-holdout`, `natural` (hand-written prompts shipped in data/natural.jsonl), or a jsonl
    file of {"messages": [...]} (or {"prompt": "..."}): the prompt is every message up to and
    including the last user turn (system, user and earlier assistant turns as context), so a
    multi-turn line benches its last user turn."""
    return [row.messages for row in read_prompt_rows(source, limit)]


def read_prompt_rows(source: str, limit: int | None = None) -> list[PromptRow]:
    """read_prompts with each line's optional `category` (natural.jsonl: writing, coding, ...)."""
    if source == LONG:
        raise SpecdraftError("--prompts long: the long-context set is built for a target's tokenizer and context; "
                             "run it with `specdraft bench --prompts long`")
    if source == "builtin-holdout":
        rows = [PromptRow([{"role": "user", "content": p}]) for p in builtin_prompts(limit or 32, split="holdout")]
    else:
        path = prompt_set_path(source)
        if path.is_dir():
            raise SpecdraftError(f"--prompts {source}: is a directory; pass a jsonl file or builtin-holdout")
        if not path.is_file():
            raise SpecdraftError(f"--prompts {source}: file not found; pass a jsonl file or builtin-holdout")
        rows = []
        for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SpecdraftError(f"{path}:{n}: not UTF-8 (byte {e.start}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpecdraftError(f"{path}:{n}: not valid JSON ({e.msg}); one object per line") from None
            category = row.get("category") if isinstance(row, dict) else None
            if category is not None and not (isinstance(category, str) and category.strip()):
                raise SpecdraftError(f"{path}:{n}: category is {json.dumps(category)[:40]}, not a name; "
                                     'give a name such as "coding" or drop the field')
            if isinstance(row, dict) and isinstance(row.get("prompt"), str):
                rows.append(PromptRow([{"role": "user", "content": row["prompt"]}], category))
                continue
            messages = row.get("messages") if isinstance(row, dict) else None
            if not isinstance(messages, list):
                raise SpecdraftError(f"{path}:{n}: no `messages` list; expected "
                                     '{"messages": [{"role": "user", "content": ...}]}')
            turns = prompt_turns(messages, f"{path}:{n}")
            if turns:
                rows.append(PromptRow(turns, category))
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise SpecdraftError(f"--prompts {source}: no prompts (no line with a user turn); add some or use builtin-holdout")
    return rows


def prompt_turns(messages: list, where: str) -> list[dict]:
    """Every message up to and including the last user turn ([] without one): the answers before
    it are context, an answer after it (the reply a dataset line may carry) is not prompted."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise SpecdraftError(f"{where}: message {i} is {json.dumps(m)[:40]}, not an object; "
                                 'write it as {"role": ..., "content": ...}')
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    turns = []
    for m in messages[:users[-1] + 1] if users else []:
        if not isinstance(m.get("content"), str):   # str(None) was prompted as the text "None"
            raise SpecdraftError(f"{where}: {m.get('role')} content is "
                                 f"{json.dumps(m.get('content'))[:40]}, not a string; give the turn its text")
        turns.append({"role": m.get("role"), "content": m["content"]})
    return turns


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


@dataclass
class Method:
    name: str
    proposer: object | None          # None: no drafts (plain decoding)
    hf: bool = False                 # plain decoding by transformers' generate, not by our loop
    rows: int | None = None          # R of every round in our loop (assign_rows)


def is_chain(name: str) -> bool:
    """A drafter family's own chain: the method -k auto chooses K (and R) for."""
    return name in families.names()


def assign_rows(methods: list[Method], rows: int | None, chain_rows: int | None, plain_rows: int | None) -> None:
    """R per loop method, refused before any run where a round needs more: --verify-rows for every one;
    else `chain_rows` for the drafter's chain and `plain_rows` for plain decoding (shape_rows); the rest at
    their own round_rows."""
    for m in methods:
        if not m.hf:
            shared = rows or (plain_rows if m.name == "plain" else chain_rows if is_chain(m.name) else None)
            m.rows = checked_rows(m.proposer, shared, m.name)


def build_methods(names: list[str], drafter, k: int, tree: TreeShape | None, ngram_max: int,
                  ngram_min: int, draft_stop: float | None = None, ngram_k: int | None = None,
                  datastore: Datastore | None = None, hybrid_tree: bool = True) -> list[Method]:
    """The methods `names` name, checked by the command that read them (run_bench, generate_one:
    known names, each drafter method with a drafter of its family) before any model loaded.
    `datastore`: the target's answers that ngram and hybrid also draft from (infer/ngram.py)."""
    methods = []
    for name in names:
        if name == "greedy":
            methods.append(Method(name, None, hf=True))
        elif name == "plain":
            methods.append(Method(name, None))
        elif name == "ngram" or (name == HYBRID and k == 0):   # hybrid without a drafter chain that pays
            methods.append(Method(name, NgramProposer(ngram_k or k or DRAFT_LENGTH, ngram_max, ngram_min, datastore)))
        elif k == 0 and not name.endswith(TREE):   # -k auto found no chain that pays here: plain decoding
            methods.append(Method(name, None))
        elif name == HYBRID:
            chain = family_of(drafter).proposer(drafter, k=k, stop=draft_stop)
            methods.append(Method(name, HybridProposer(chain, ngram_k or k, ngram_max, ngram_min, datastore=datastore,
                                                       tree=hybrid_tree)))
        elif not name.endswith(TREE):
            methods.append(Method(name, family_of(drafter).proposer(drafter, k=k, stop=draft_stop)))
        else:
            drafted = family_of(drafter).proposer(drafter, tree=tree or TreeShape.parse(DEFAULT_TREE))
            methods.append(Method(name, drafted if name != HYBRID_TREE else HybridProposer(
                drafted, ngram_k or k or DRAFT_LENGTH, ngram_max, ngram_min, datastore=datastore)))
    return methods


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
          hybrid_tree: bool = True, chat: Chat | None = None) -> dict:
    """Same prompts for every method, batch 1, one warm-up generation per method first (which compiles, under
    `compile`); then `rounds` rounds, each running every method on every prompt, the order rotated per round.
    rows: every loop method at that row count; chain_rows, plain_rows: the drafter's chain's and plain
    decoding's (assign_rows). Plain decoding is the reference of every method at its R (the same tokens
    in any dtype: `identical_to_plain`), and is added to the methods when rows are given, or when
    chain_rows are and the target computes in a dtype other than float32 (where transformers' greedy
    sums in other orders). `chat`: the template with its arguments (default: none), which renders the
    prompts and splits τ into reasoning and answer (tau_by_part)."""
    if rounds < 1:
        raise SpecdraftError(f"--rounds {rounds}: must be >= 1 (3 or more to see the spread)")
    model, tok = target.model, target.tokenizer
    eos = eos_ids_of(model, tok)
    chat = chat or Chat(tok, sorted(eos))
    prompts = [prompt_ids(tok, c, chat.kwargs) for c in conversations]
    names = ["greedy"] + [n for n in method_names if n != "greedy"]   # greedy is the reference
    not_fp32 = next(model.parameters()).dtype != torch.float32
    if (rows or (chain_rows and not_fp32)) and "plain" not in names:  # ... and plain, at the same rows
        names.append("plain")
    methods = build_methods(names, drafter, k, tree, ngram_max, ngram_min, draft_stop, ngram_k, datastore, hybrid_tree)
    assign_rows(methods, rows, chain_rows, plain_rows)
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
    load_end = machine_load()
    reference = [g.token_ids for g in runs["greedy"][0]]
    greedy_tps = [summarize("greedy", rs, None)["tokens_per_s"] for rs in runs["greedy"]]
    results = {n: summarize_rounds(n, runs[n], reference, greedy_tps) for n in names}
    for m in methods:
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
    if "plain" in results:             # what drafting adds over the same loop with no drafter
        plain = results["plain"]["tokens_per_s"]
        for r in results.values():
            r["speedup_over_plain"] = r["tokens_per_s"] / plain if plain else 0.0
    warnings = [w for w in [busy_warning("bench", load_start, load_end, torch.get_num_threads())] if w]
    warnings += [divergence_line(n, r, len(prompts), str(next(model.parameters()).dtype).replace("torch.", ""))
                 for n, r in results.items() if r.get("divergences")]
    warnings += [f"warning: bench: {n} gave different tokens or acceptance in different rounds (greedy decoding "
                 "should be deterministic)" for n, r in results.items() if not r["same_in_every_round"]]
    return {"methods": results, "rounds": rounds, "order": order,
            "load": {"start": load_start, "end": load_end, "cores": os.cpu_count()}, "warnings": warnings}


def round_sections(gens: list[Generation], prompts: list[list[int]], chat: Chat, context_edges, k) -> dict:
    """A drafting method's τ by context length (every verify round of round 1 in its bucket) and, for a
    thinking template, by part (tau_by_part)."""
    return {"by_context": rounds_by_context([c for g in gens for c in g.contexts], [a for g in gens for a in g.accepted],
                                            context_edges, k),
            "tau_by_part": tau_by_part(chat, prompts, gens)}


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


def environment(device: str, dtype: str) -> dict:
    import transformers

    return {"device": device, "dtype": dtype, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads()}


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


def check_bench_options(names: list[str], methods: str, chains: list[str], k, k_option, stop, tree, dtype: str,
                        datastore=None) -> None:
    """bench's settings checked before any model loads: every one names a method that uses it."""
    bad = [n for n in names if n not in all_methods()]
    if bad or not names:
        raise SpecdraftError(f"--methods {methods}: unknown {bad or 'empty'}; choose from {', '.join(all_methods())}")
    check_compute_dtype(dtype)
    if (k is None or stop is not None) and not chains:
        raise SpecdraftError("--num-speculative-tokens auto and --draft-stop: for a drafter's chain; add its family "
                             f"({', '.join(families.names())}) to --methods")
    # a setting no method uses is refused, never measured as if it took effect
    if tree is not None and not any(n.endswith(TREE) for n in names):
        trees = [n for n in all_methods() if n.endswith(TREE)]
        raise SpecdraftError(f"--tree {tree}: no method in --methods {methods} drafts a tree; add "
                             f"{' or '.join(trees) or 'a tree method'} or drop --tree")
    if k_option is not None and all(n in ("greedy", "plain") or n.endswith(TREE) for n in names):
        raise SpecdraftError(f"-k {k_option}: no method in --methods {methods} drafts a chain (greedy and plain decode "
                             "one token a step; a tree's size is --tree's); add ngram, hybrid or a drafter family, "
                             "or drop -k")
    check_datastore_methods(datastore, names, "--methods")


AUTO_DTYPE_ROWS = 4      # --compute-dtype auto times matmuls at the rows of a K=3 chain's verify


def compute_dtype(dtype: str, model: str, device: str, trust_remote_code: bool) -> str:
    """--compute-dtype for bench and generate: as asked, or for auto the faster one on this machine
    (dtypes.auto_dtype: bf16 on a GPU, on a CPU where bf16 matmuls measure faster; float32 under
    SPECDRAFT_KERNEL_PATH=linear). Outside float32 lossless means plain decoding's tokens at the same R."""
    from specdraft.dtypes import auto_dtype
    from specdraft.targets import target_config

    return auto_dtype(dtype, target_config(model, trust_remote_code), AUTO_DTYPE_ROWS, gpu=device.startswith("cuda"))


def datastore_readers(names: list[str], form: str | None) -> list[str]:
    """The methods that draft from --datastore: n-gram and the hybrid tree (hybrid-tree, or hybrid in its
    tree form); hybrid as the switch drafts from the context alone (infer/hybrid.py)."""
    return [n for n in names if n in ("ngram", HYBRID_TREE) or n == HYBRID and form != "switch"]


def unused_datastore_line(names: list[str], form: str | None) -> str | None:
    """The line said where hybrid runs as the switch with --datastore: nothing it runs reads the datastore."""
    if HYBRID in names and form == "switch" and not datastore_readers(names, form):
        return ("--datastore: hybrid runs as the switch on this machine (its verify curve), which drafts from the "
                "context alone: the datastore is unused; --tree runs the tree form, which reads it")
    return None


def refuse_given(options: dict, line) -> None:
    """Refuse the first of `options` (flag -> value) that was given (neither None nor False): `line(flag)`."""
    given = next((flag for flag, value in options.items() if value not in (None, False)), None)
    if given is not None:
        raise SpecdraftError(line(given))


def check_served_only(options: dict) -> None:
    """Options of `bench --engine vllm` alone: refused by name in specdraft's own loop."""
    refuse_given(options, lambda flag: f"{flag}: applies to --engine vllm only; add --engine vllm or drop {flag}")


def check_datastore_methods(datastore, names: list[str], option: str) -> None:
    if datastore is not None and not {"ngram", HYBRID, HYBRID_TREE} & set(names):
        raise SpecdraftError(f"--datastore {datastore}: only ngram and hybrid draft from it; add one to {option} "
                             "or drop --datastore")


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
    check_bench_options(names, methods, chains, k, k_option, stop, tree, dtype, datastore)
    shape = TreeShape.parse(tree or DEFAULT_TREE)
    edges = parse_context_buckets(context_buckets)
    if max_context is not None and prompts != LONG:
        raise SpecdraftError(f"--max-context {max_context}: bounds the long-context prompt set only; add "
                             "--prompts long or drop --max-context")
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
    total = len(conversations) * len(set(names) | {"greedy"}) * rounds
    with progress("bench", total, 0, "runs", console=Console(stderr=True)) as tracker:
        report = bench(target, draft_model, conversations, names, max_new_tokens, k, shape, ngram[1], ngram[0],
                       progress=lambda name: tracker.advance(1, method=name), rounds=rounds, draft_stop=stop,
                       ngram_k=ngram_k, rows=rows, context_edges=edges, datastore=answers, compile=compile,
                       hybrid_tree=form != "switch", chat=chat, **shape_rows(choice, k, dtype))
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


def target_chat(target, kwargs: dict) -> Chat:
    """The target's chat format with --chat-template-kwargs (checked: each one its template reads)."""
    from specdraft.adapter import architecture

    tok = target.tokenizer
    if kwargs and not getattr(tok, "chat_template", None):
        raise SpecdraftError(f"--chat-template-kwargs: {target.name} has no chat template to take them; drop them")
    check_template_kwargs(tok, kwargs, target.name)
    ends = end_of_turn_ids(tok, getattr(target.model, "generation_config", None), architecture(target.config).end_tokens)
    return Chat(tok, ends, kwargs)


def hybrid_form(target, names: list[str], choice, k: int, ngram_k: int, ids: list[int],
                greedy: bool = True) -> str | None:
    """"tree" or "switch" (infer/hybrid.py) for a hybrid with a drafter chain, None without one: the tree
    where hybrid.tree_pays on this machine's verify curve (-k auto's, else timed now at this prompt's
    length), said in one line on stderr. Sampling always runs the switch."""
    if HYBRID not in names or k == 0:
        return None
    if not greedy:
        return "switch"
    from rich.console import Console

    from specdraft.infer.auto import measure_costs

    rows = 1 + k + ngram_k
    verify = choice.verify_ms if choice is not None and len(choice.verify_ms) >= rows else \
        measure_costs(target.model, None, rows, len(ids), label="hybrid: timing")["verify_ms"]
    form = "tree" if tree_pays(verify, k, ngram_k) else "switch"
    switch = 1 + max(k, ngram_k)
    Console(stderr=True).print(f"hybrid: the {form} (verify of {rows} rows {verify[rows - 1]:.1f} ms, of {switch} "
                               f"{verify[switch - 1]:.1f} ms; the tree where at most {TREE_PAYS:.2f}x)",
                               highlight=False, soft_wrap=True, markup=False)
    return form


def shape_rows(choice, k: int, dtype: str) -> dict:
    """R of the drafter's chain and of plain decoding when --verify-rows is not given. The chain: the R
    -k auto chose, else K+1 outside float32, else its own round_rows (None). Plain decoding: the
    chain's R outside float32 (one shape: plain is then the chain's lossless reference), else the R
    -k auto measured cheapest for one row (its own speed), else 1."""
    from specdraft.infer.costmodel import cheapest_rows

    chain = choice.rows if choice is not None else k + 1 if dtype != "float32" else None
    if dtype != "float32":
        return {"chain_rows": chain, "plain_rows": chain}
    return {"chain_rows": chain, "plain_rows": cheapest_rows(choice.verify_ms, 1) if choice is not None else None}


def compare_with_plain(results: dict, runs: dict) -> None:
    """Each method's round-1 tokens against plain decoding's at the same R: identical_to_plain, and on how
    many prompts (a chain is bit-identical in any dtype, a tree only where its sums fall alike). A
    method at another R is not compared: its sums differ by design."""
    plain_tokens = [g.token_ids for g in runs["plain"][0]]
    for n, r in results.items():
        if n != "greedy" and r["rows"] == results["plain"]["rows"]:
            same = [g.token_ids == t for g, t in zip(runs[n][0], plain_tokens)]
            r["identical_to_plain"], r["prompts_identical_to_plain"] = all(same), sum(same)


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
