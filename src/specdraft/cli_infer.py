"""The inference sub-commands of `specdraft` (bench, generate): wiring only, as in cli.py, which
registers them on its app after eval."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from specdraft.defaults import draft_length_option, parse_draft_stop
from specdraft.errors import SpecdraftError
from specdraft.families import DEFAULT as DEFAULT_FAMILY
from specdraft.flags import (AS_JSON, CHAT_TEMPLATE_KWARGS, ENGINE_MEANING, COMPILE, COMPUTE_DTYPE, CONTEXT_BUCKETS, DATASTORE, DEVICE,
                             DRAFT_LENGTH_OR_AUTO, DRAFT_STOP, DRAFTER_OR_UNTRAINED, MAX_CONTEXT, MAX_NEW_TOKENS_HELP,
                             MODEL, NGRAM_MAX, NGRAM_MIN, PROMPTS_HELP, SEED_HELP, TEMPERATURE_HELP, TREE_HELP, TRUST,
                             VERIFY_ROWS, check_out, command, out_option, say)

APP = typer.Typer()   # collects the commands until register() copies them onto the specdraft app


def register(app: typer.Typer) -> None:
    """Add bench and generate to `app` (cli.py's), keeping their order."""
    app.registered_commands.extend(APP.registered_commands)


@command(APP)
def bench(
    model: str = MODEL,
    drafter: Optional[str] = DRAFTER_OR_UNTRAINED,
    prompts: str = typer.Option("builtin-holdout", "--prompts", help=PROMPTS_HELP + " Here: or long (summarize, "
                                "answer, continue over long documents from the Python standard library and licences)."),
    methods: Optional[str] = typer.Option(None, "--methods", help="Comma list of greedy (transformers generate), "
                                "plain (specdraft's loop, no drafter), ngram, a drafter family (its chain; `specdraft "
                                "info` lists them), FAMILY-tree (where the family drafts trees), hybrid (the drafter and "
                                f"n-gram in one verify), hybrid-tree (over its tree). Default greedy,plain,ngram,"
                                f"{DEFAULT_FAMILY}; with --engine vllm: plain, ngram and the drafter's family."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help=MAX_NEW_TOKENS_HELP + " Here: per prompt."),
    num_speculative_tokens: Optional[str] = DRAFT_LENGTH_OR_AUTO, draft_stop: Optional[str] = DRAFT_STOP,
    rounds: int = typer.Option(3, "--rounds", help="Timing rounds, the order rotated per round; the medians count. "
                               "Here: each runs every method on every prompt."),
    tree: Optional[str] = typer.Option(None, "--tree", help=TREE_HELP + " Here: for FAMILY-tree, hybrid-tree (default 4,4,16)."),
    ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN, datastore: Optional[Path] = DATASTORE,
    limit: Optional[int] = typer.Option(None, "--limit", help="Use the first N. Here: prompts (builtin-holdout: 32)."),
    out: Optional[Path] = out_option("the results JSON and a .png chart."), as_json: bool = AS_JSON,
    time_split: bool = typer.Option(False, "--time-split", help="Print the draft / verify / other time split."),
    compiled: bool = COMPILE, verify_rows: Optional[int] = VERIFY_ROWS, context_buckets: Optional[str] = CONTEXT_BUCKETS, device: str = DEVICE,
    max_context: Optional[int] = MAX_CONTEXT, compute_dtype: str = COMPUTE_DTYPE, trust_remote_code: bool = TRUST,
    chat_template_kwargs: Optional[str] = CHAT_TEMPLATE_KWARGS,
    engine: str = typer.Option("specdraft", "--engine", help=ENGINE_MEANING + " Here: specdraft (our decoding loop) "
                               "or vllm (the export served by vLLM, each method its own engine, against vLLM's plain "
                               "decoding; -k takes a list such as 1,2,3)."),
    batch: Optional[int] = typer.Option(None, "--batch", help="--engine vllm: the batch measured beside batch 1 "
                                        "(default 8, at most the prompts)."),
    breakdown: bool = typer.Option(False, "--breakdown", help="--engine vllm: time the parts of each engine step "
                                   "(target forward, drafting, sampling, the rest); engines run in one process.")):
    """Wall-clock speed of every method on the same prompts. greedy, plain (specdraft's loop, no
    drafter), n-gram and drafters, in interleaved rounds (median and spread per method)."""
    from specdraft.infer.bench import run_bench
    from specdraft.infer.bench_output import plot, print_report, time_split_lines
    from specdraft.infer.methods import check_served_only
    from specdraft.io import write_json

    check_out(out, [prompts, drafter, datastore], ".json", "bench")
    check_out(out and out.with_suffix(".png"), [prompts, drafter, datastore], ".png", "bench")
    if engine != "specdraft":
        return bench_served(engine, model, drafter, prompts, methods, max_new_tokens, num_speculative_tokens, batch,
                            rounds, limit, out, (ngram_min, ngram_max), chat_template_kwargs, compute_dtype, breakdown,
                            trust_remote_code, as_json, {"--tree": tree, "--datastore": datastore, "--draft-stop": draft_stop,
                            "--verify-rows": verify_rows, "--context-buckets": context_buckets, "--max-context":
                            max_context, "--compile": compiled, "--time-split": time_split,
                            "--device": None if device == "auto" else device})
    check_served_only({"--batch": batch, "--breakdown": breakdown})
    k, stop = draft_length_option(num_speculative_tokens), parse_draft_stop(draft_stop)   # parsed here, once
    report = run_bench(model, drafter, prompts, methods or f"greedy,plain,ngram,{DEFAULT_FAMILY}", max_new_tokens,
                       k, stop, rounds, tree, (ngram_min, ngram_max),
                       limit, device, compute_dtype, trust_remote_code, verify_rows, context_buckets, max_context,
                       datastore, compiled, chat_template_kwargs)
    say(report["warnings"])
    print_report(report, as_json)
    say(time_split_lines(report) if time_split else [])
    if out is not None:
        write_json(out, report)
        plot(report, out.with_suffix(".png"))
        say(f"bench -> {out}, {out.with_suffix('.png')}")


@command(APP)
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="User message (the chat template is applied)."),
    model: str = MODEL, drafter: Optional[str] = DRAFTER_OR_UNTRAINED,
    method: str = typer.Option(DEFAULT_FAMILY, "--method", help="greedy (no drafting), ngram, the drafter's family "
                               "(`specdraft info` lists them), or hybrid (drafter + n-gram; with --tree, over its tree)."),
    num_speculative_tokens: Optional[str] = DRAFT_LENGTH_OR_AUTO, draft_stop: Optional[str] = DRAFT_STOP,
    tree: Optional[str] = typer.Option(None, "--tree", help=TREE_HELP + " Here: greedy only."),
    temperature: float = typer.Option(0.0, help=TEMPERATURE_HELP + " Here: >0 samples; rejection sampling keeps the "
                                      "target's distribution."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass."),
    seed: int = typer.Option(0, help=SEED_HELP + " Here: sampling."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help=MAX_NEW_TOKENS_HELP),
    ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN, datastore: Optional[Path] = DATASTORE,
    device: str = DEVICE, compute_dtype: str = COMPUTE_DTYPE, verify_rows: Optional[int] = VERIFY_ROWS,
    as_json: bool = AS_JSON, trust_remote_code: bool = TRUST, compiled: bool = COMPILE,
    chat_template_kwargs: Optional[str] = CHAT_TEMPLATE_KWARGS):
    """Speculative generation for one prompt. Streams the answer, then tokens/s and τ."""
    from specdraft.infer.generate import generate_one
    from specdraft.infer.sampling import Sampling
    from specdraft.metrics import tau_text

    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
    k, stop = draft_length_option(num_speculative_tokens), parse_draft_stop(draft_stop)   # parsed here, once
    result, name = generate_one(prompt, model, drafter, method, k, stop, tree, sampling, max_new_tokens,
                                (ngram_min, ngram_max), device, compute_dtype, trust_remote_code,
                                stream=not as_json, rows=verify_rows, datastore=datastore, compile=compiled,
                                template_kwargs=chat_template_kwargs)
    if as_json:
        return print(json.dumps(result))
    sys.stdout.write("\n")
    say(f"{result['new_tokens']} tokens, {result['tokens_per_s']:.1f} tokens/s, "
        f"{tau_text(result['accept_len'], result.get('k'), 'prompt')} ({name})")


def bench_served(engine: str, model: str, drafter: Optional[str], prompts: str, methods: Optional[str],
                 max_new_tokens: int, k_text: Optional[str], batch: Optional[int], rounds: int, limit: Optional[int],
                 out: Optional[Path], ngram: tuple[int, int], template_kwargs: Optional[str], dtype: str,
                 breakdown: bool, trust_remote_code: bool, as_json: bool, unused: dict) -> None:
    """`bench --engine vllm`: the export served by vLLM against vLLM's plain decoding (infer/served.py)."""
    from rich.console import Console

    from specdraft.infer import served
    from specdraft.io import write_json

    if engine != "vllm":
        raise SpecdraftError(f"--engine {engine}: choose specdraft (our loop) or vllm")
    served.check_unused(unused)
    folder = (out.with_suffix("") if out is not None else Path("bench-vllm"))
    check_out(folder / "x", [prompts, drafter], "")
    report = served.run_served_bench(model, drafter, prompts, methods, max_new_tokens, k_text, batch, rounds, limit,
                                     folder, ngram, template_kwargs, dtype, breakdown=breakdown,
                                     trust_remote_code=trust_remote_code, say=lambda line: say(f"bench: {line}"))
    if as_json:
        print(json.dumps(report))
    else:
        Console().print(served.table(report))
        say([served.verdict(report), *served.breakdown_lines(report)])
    if out is not None:
        write_json(out, report)
        say(f"bench -> {out} (engine logs and export in {folder})")
    if report["errors"]:
        raise SpecdraftError(f"vLLM could not serve {', '.join(report['errors'])}: {next(iter(report['errors'].values()))}")
