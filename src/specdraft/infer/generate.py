"""`specdraft generate`: speculative decoding of one prompt, the answer streamed as it comes."""

from __future__ import annotations

import sys

from specdraft import families
from specdraft.defaults import check_compute_dtype
from specdraft.errors import SpecdraftError
from specdraft.infer.hybrid import HYBRID
from specdraft.infer.methods import (TREE, all_methods, build_methods, check_datastore_methods, check_drafter_methods,
                                     compute_dtype, datastore_readers, hybrid_form, is_chain, load_drafter_for,
                                     needs_drafter, unused_datastore_line)
from specdraft.infer.ngram import Datastore
from specdraft.infer.prompts import prompt_ids, target_chat
from specdraft.targets import resolve_device
from specdraft.templates import parse_template_kwargs


def check_options(method: str, k_option, stop, tree: str | None, sampling, dtype: str, datastore, drafter):
    """generate's options checked before any load -> (K or None for -k auto, the tree shape, the method's name)."""
    from specdraft.defaults import draft_length
    from specdraft.infer.tree import TreeShape

    chain = needs_drafter(method) and not tree                     # a drafter's chain: -k auto applies
    k = draft_length(k_option, default_auto=chain)
    choices = ["greedy", "ngram", *(n for n in all_methods() if needs_drafter(n) and not n.endswith(TREE))]
    if method not in choices:
        raise SpecdraftError(f"--method {method}: unknown; choose {', '.join(choices)}")
    if (k is None or stop is not None) and not chain:
        raise SpecdraftError("--num-speculative-tokens auto and --draft-stop: only with a drafter's chain (--method "
                             f"{', '.join(families.names())}; no --tree)")
    check_compute_dtype(dtype)
    shape = TreeShape.parse(tree) if tree else None
    tree_methods = [n for n in families.names() if families.family(n).tree] + [HYBRID]     # Family.tree says
    if shape is not None and (method not in tree_methods or not sampling.greedy):
        raise SpecdraftError(f"--tree: only with --method {' or '.join(tree_methods)} and greedy decoding "
                             "(--temperature 0)")
    name = method + TREE if shape else method
    check_datastore_methods(datastore, [name], "--method")
    if drafter is None:
        check_drafter_methods([name], None, "--method")
    return k, shape, name


def plain_rows_line(target_model, context: int) -> int:
    """Plain decoding's R on this machine (auto.plain_rows), said in a line where it is not one row."""
    from specdraft.infer.auto import plain_rows

    rows, curve = plain_rows(target_model, context)
    if rows > 1:
        print(f"note: plain decoding at R={rows} rows, one of them real: a forward measured {curve[rows - 1]:.1f} ms "
              f"against {curve[0]:.1f} at one row on this machine (--verify-rows 1 runs one row)", file=sys.stderr,
              flush=True)
    return rows


def generate_one(prompt: str, model: str, drafter: str | None, method: str, k_option: int | str | None,
                 stop: float | str | None,
                 tree: str | None, sampling, max_new_tokens: int, ngram: tuple[int, int], device: str, dtype: str,
                 trust_remote_code: bool, stream: bool, rows: int | None = None,
                 datastore: str | None = None, compile: bool = False,
                 template_kwargs: str | dict | None = None) -> tuple[dict, str]:
    """-> ({text, token_ids, tokens_per_s, accept_len, new_tokens}, the method's name). `k_option`,
    `stop`: -k and --draft-stop as the CLI parsed them (defaults.py); -k unset is auto for a drafter's
    chain and DRAFT_LENGTH otherwise; options are checked before the model loads."""
    from specdraft.infer.auto import resolve
    from specdraft.infer.speculative import eos_ids_of, generate
    from specdraft.targets import DTYPES, load_target

    kwargs = parse_template_kwargs(template_kwargs)                  # --chat-template-kwargs: before any load
    k, shape, name = check_options(method, k_option, stop, tree, sampling, dtype, datastore, drafter)
    dev = resolve_device(device)
    dtype = compute_dtype(dtype, model, dev, trust_remote_code)
    target = load_target(model, dtype=dtype, device=dev, trust_remote_code=trust_remote_code)
    draft_model = load_drafter_for(drafter, target, dev, DTYPES[dtype]) if needs_drafter(method) else None
    if draft_model is not None:
        check_drafter_methods([name], draft_model, "--method")
    tok = target.tokenizer
    chat, ids = target_chat(target, kwargs), prompt_ids(tok, [{"role": "user", "content": prompt}], kwargs)
    k, stop, choice = resolve(target, draft_model, drafter, ids, k, stop)
    if choice is not None and is_chain(method) and rows is None:
        rows = choice.rows                                    # the R -k auto measured cheapest for its K
    if method == "greedy" and rows is None and not compile:
        rows = plain_rows_line(target.model, len(ids))
    answers = Datastore.from_prepared(datastore, target) if datastore else None
    form = hybrid_form(target, [name], choice, k, k, ids, sampling.greedy)
    unused = unused_datastore_line([name], form) if answers else None
    if unused:
        print(f"warning: {unused}", file=sys.stderr, flush=True)
    m = build_methods([name], draft_model, k, shape, ngram[1], ngram[0], stop, datastore=answers,
                      hybrid_tree=form != "switch")[0]
    shown = {"ids": [], "text": ""}

    def show(new):
        shown["ids"].extend(new)
        text = tok.decode(shown["ids"], skip_special_tokens=True)
        sys.stdout.write(text[len(shown["text"]):])
        sys.stdout.flush()
        shown["text"] = text

    result = generate(target.model, ids, m.proposer, max_new_tokens, sampling, eos_ids_of(target.model, tok),
                      show if stream else None, sync_cuda=dev.startswith("cuda"), rows=rows,
                      compile=compile)
    return ({"text": tok.decode(result.token_ids, skip_special_tokens=True), "token_ids": result.token_ids,
             "tokens_per_s": result.tokens_per_s, "accept_len": result.accept_len,
             "new_tokens": len(result.token_ids), "k": k if needs_drafter(method) or method == "ngram" else 0,
             "chat_template_kwargs": kwargs, "thinking": chat.mode(),
             "datastore": answers and {**answers.describe(datastore), "read_by": datastore_readers([name], form)}},
            m.name)
