"""The `specdraft` command: one sub-command per stage. Wiring only: parse, call the stage, print.
The flags' vocabulary (shared options, bounds, help) is specdraft/flags.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from specdraft.defaults import DRAFT_LENGTH, LONGEST_CHAIN
from specdraft.errors import SpecdraftError
from specdraft.flags import (AS_JSON, BASELINE_HELP, CONFIG_HELP, CONVERSATIONS_HELP, PART_HELP, PROFILE_HELP,
                             OUT_HELP, STORE_FORMAT_HELP, TREE_HELP, VOCAB_HELP, WORKSPACE_HELP, COMPUTE_DTYPE, DEVICE, DRAFT_STOP, DRAFTER_HELP, ENGINE, ENGINE_ARGS,
                             MAX_NEW_TOKENS_HELP, MODEL, MODEL_HELP, NGRAM_MAX, NGRAM_MIN, NUM_SPEC, PREPARED_HELP,
                             SEED_HELP, STORE_HELP, TEMPERATURE_HELP, TP, TRUST, PlainCommand, check_out, command,
                             draft_length_help, numbers_checked_first, parse_floats, parse_layers, plain_app)
from specdraft.train.command import train as train_command

app = plain_app("Train, evaluate and ship speculative-decoding drafters (EAGLE-3 and its kin).")
vocab_app = plain_app("Draft vocabulary: build, diff, remap.")
store_app = plain_app("Hidden-state stores: convert between store formats.")
journal_app = plain_app("Decision journal beside a run (RUN/journal.md).")
app.add_typer(store_app, name="store")
app.add_typer(vocab_app, name="vocab")
app.add_typer(journal_app, name="journal")
console = Console(stderr=True)


def say(lines) -> None:
    """Stage summaries and warnings on stderr, never wrapped (log files keep whole lines)."""
    for line in [lines] if isinstance(lines, str) else lines:
        console.print(line, highlight=False, soft_wrap=True, markup=False)


def version_callback(value: bool) -> None:
    if value:
        from specdraft import __version__

        print(f"specdraft {__version__}")
        raise typer.Exit()


@app.callback()
def root(version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                      help="Print the version and exit.")):
    """Train, evaluate and ship speculative-decoding drafters (EAGLE-3 and its kin)."""


@command(app)
def info(model: str = MODEL, trust_remote_code: bool = TRUST, as_json: bool = AS_JSON):
    """Architecture, layers, hidden size, vocab, tied lm_head, chat template, default aux layers,
    and the drafter families `train --family` takes."""
    from specdraft.families import names
    from specdraft.targets import info as target_info

    data = {**target_info(model, trust_remote_code), "drafter_families": names()}
    print(json.dumps(data, indent=2) if as_json else "\n".join(f"{k:20s} {v}" for k, v in data.items()))


@command(app)
def prepare(
    conversations: str = typer.Option(..., "--conversations", help=CONVERSATIONS_HELP),
    out: Path = typer.Option(..., "--out", help=OUT_HELP + " Here: the prepared data folder, e.g. WS/data."),
    model: str = MODEL,
    regenerate: bool = typer.Option(False, "--regenerate", help="Replace assistant turns with the target's own answers."),
    temperature: float = typer.Option(0.0, help=TEMPERATURE_HELP + " Here: of the regenerated answers."),
    max_new_tokens: int = typer.Option(256, help=MAX_NEW_TOKENS_HELP + " Here: per regenerated assistant turn."),
    max_length: int = typer.Option(2048, help="Drop conversations longer than this many tokens."),
    min_assistant_tokens: int = typer.Option(1, help="Drop samples with fewer loss-masked tokens."),
    dedup: bool = typer.Option(True, "--dedup/--no-dedup", help="Drop duplicate conversations."),
    limit: Optional[int] = typer.Option(None, help="Use the first N. Here: samples."),
    batch_size: int = typer.Option(16, help="Regeneration batch size."),
    split: str = typer.Option("train", help="Which part of the data. Here: the hub dataset's split."),
    seed: int = typer.Option(0, help=SEED_HELP + " Here: builtin prompts and sampling."),
    trust_remote_code: bool = TRUST, engine: str = ENGINE,
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Regenerate through a running `vllm serve` "
                                           "(OpenAI-compatible), e.g. http://HOST:8000/v1."),
    tensor_parallel_size: int = TP, engine_args: Optional[str] = ENGINE_ARGS,
    part: Optional[str] = typer.Option(None, "--part", help=PART_HELP),
):
    """Render conversations with the chat template and build the assistant-token loss mask."""
    from specdraft.data.prepare import prepare as run_prepare, summary_lines
    from specdraft.data.prepared import parse_part
    from specdraft.data.vllm_engine import engine_options
    from specdraft.io import own_folder

    share = parse_part(part)
    opts = engine_options(engine, tensor_parallel_size, engine_args, endpoint)
    with own_folder(out, "prepare"):
        summary = run_prepare(model=model, source=conversations, out=out, regenerate=regenerate,
                              temperature=temperature, max_new_tokens=max_new_tokens, max_length=max_length,
                              min_assistant_tokens=min_assistant_tokens, dedup=dedup, limit=limit,
                              batch_size=batch_size, split=split, seed=seed, trust_remote_code=trust_remote_code,
                              engine=opts, part=share)
    say(summary_lines(summary, out))


@command(app)
def capture(
    prepared: Optional[Path] = typer.Option(None, "--prepared", help=PREPARED_HELP + " Here: required, but for --verify."),
    out: Path = typer.Option(..., "--out", help=OUT_HELP + " Here: the store folder, e.g. WS/hidden."),
    model: str = MODEL,
    layers: Optional[str] = typer.Option(None, help="Aux layer ids, any number, e.g. 2,15,27 (default [2, L//2, L-3])."),
    store_dtype: str = typer.Option("bfloat16", "--store-dtype", help="Dtype the bf16 store format keeps: "
                                    "bfloat16, float16 or float32."),
    batch_tokens: int = typer.Option(4096, help="Tokens per forward (length-bucketed batches)."),
    shard_tokens: int = typer.Option(65536, help="Tokens per shard file."),
    resume: bool = typer.Option(False, "--resume", help="Continue where an interrupted run stopped."),
    verify: bool = typer.Option(False, "--verify", help="Only re-hash the shards of --out and report."),
    compute_dtype: str = COMPUTE_DTYPE, trust_remote_code: bool = TRUST, engine: str = ENGINE,
    tensor_parallel_size: int = TP, engine_args: Optional[str] = ENGINE_ARGS,
    store_format: str = typer.Option("bf16", "--store-format", help=STORE_FORMAT_HELP),
    part: Optional[str] = typer.Option(None, "--part", help=PART_HELP + " Here: train on the parts "
                                       "with --store A --store B ..."),
):
    """Store the target's aux hidden states and pre-norm last layer output, per token."""
    from specdraft.data import capture as cap
    from specdraft.data.prepared import parse_part
    from specdraft.data.store_formats import check_format
    from specdraft.data.vllm_engine import engine_options
    from specdraft.io import own_folder

    check_format(store_format)
    share = parse_part(part)
    if verify:
        report = cap.verify_store(out)
        return say(f"ok {report['shards']} shards, {report['samples']} samples, {report['tokens']} tokens "
                   f"verified in {out}")
    if prepared is None:
        raise SpecdraftError("capture: --prepared WS/data is required (or pass --verify)")
    with own_folder(out, "capture"):
        manifest = cap.capture(model=model, data=prepared, out=out, layers=parse_layers(layers), dtype=store_dtype,
                               batch_tokens=batch_tokens, shard_tokens=shard_tokens, resume=resume,
                               trust_remote_code=trust_remote_code, compute_dtype=compute_dtype,
                               engine=engine_options(engine, tensor_parallel_size, engine_args),
                               store_format=store_format, part=share)
    say(f"captured {manifest['num_samples']} samples, {manifest['num_tokens']} tokens in "
        f"{len(manifest['shards'])} shards -> {out}")


@command(store_app, "convert")
def store_convert(
    src: Path = typer.Argument(..., help="A finished store (WS/hidden)."),
    store_format: str = typer.Option(..., "--store-format", help=STORE_FORMAT_HELP),
    out: Path = typer.Option(..., "--out", help=OUT_HELP + " Here: a new, empty store folder; the source is kept."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Here: for compact, the one the "
                                        "store was captured from (default: the one its manifest names)."),
    trust_remote_code: bool = TRUST,
):
    """Re-write a store in another store format (same samples, same shards)."""
    from specdraft.data.store_convert import convert_store
    from specdraft.io import own_folder

    with own_folder(out, "store convert"):
        manifest = convert_store(src, out, store_format, model, trust_remote_code)
    say(f"converted {manifest['num_samples']} samples, {manifest['num_tokens']} tokens to {store_format} in "
        f"{len(manifest['shards'])} shards -> {out}")


@command(vocab_app, "build")
def vocab_build(
    prepared: Optional[Path] = typer.Option(None, "--prepared", help=PREPARED_HELP + " Here: count its tokens (or --store's)."),
    store: Optional[Path] = typer.Option(None, "--store", help=STORE_HELP + " Here: count its tokens (or --prepared's)."),
    size: int = typer.Option(..., "--size", help="Draft vocabulary size N."),
    out: Path = typer.Option(..., "--out", help=OUT_HELP + " Here: the vocab file, e.g. WS/vocab.safetensors."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Here: for its vocab size "
                                        "(default: the one named in the data)."),
):
    """Top-N target tokens by frequency over loss-masked tokens, as d2t offsets / t2d mask."""
    from specdraft import vocab
    from specdraft.io import check_output_file

    if prepared is not None and store is not None:
        raise SpecdraftError("--prepared and --store: pick one (the tokens are counted in one of them)")
    if prepared is None and store is None:
        raise SpecdraftError("--prepared WS/data or --store WS/hidden is required: the tokens to count")
    check_output_file(out, [prepared or store, model], ".safetensors")
    summary = vocab.build_from_data(prepared or store, size, out, model=model,
                                    kind="prepared" if prepared is not None else "store")
    say(vocab.build_summary_lines(summary, out))


@command(vocab_app, "diff")
def vocab_diff(a: Path = typer.Argument(..., help="Mapping A (.safetensors or drafter folder)."),
               b: Path = typer.Argument(..., help="Mapping B."),
               as_json: bool = AS_JSON):
    """Sizes, token-set overlap, positional matches, rows that carry over from A to B."""
    from specdraft import vocab

    d = vocab.diff(vocab.load(a), vocab.load(b))
    print(json.dumps(d, indent=2) if as_json else vocab.format_diff(d))


@command(vocab_app, "remap")
def vocab_remap(a: Path = typer.Argument(..., help="Source mapping A."),
                b: Path = typer.Argument(..., help="Destination mapping B."),
                out: Optional[Path] = typer.Option(None, "--out", help=OUT_HELP + " Here: the permutation (safetensors)."),
                as_json: bool = AS_JSON):
    """Row permutation from A's draft ids to B's, and B's rows that have no source."""
    from specdraft import vocab

    check_out(out, [a, b], ".safetensors")
    r = vocab.remap(vocab.load(a), vocab.load(b))
    if out is not None:
        vocab.save_remap(r, out)
    summary = {"carried": int((r.src >= 0).sum()), "unsourced": int((r.src < 0).sum()),
               "draft_vocab_size": int(r.src.numel())}
    print(json.dumps(summary, indent=2) if as_json else
          f"rows carried over: {summary['carried']}, rows without a source: {summary['unsourced']}")


# Its options are generated from RunConfig (train/config.py); `python -m specdraft.train` (torchrun) runs the same.
app.command("train", cls=PlainCommand)(numbers_checked_first(train_command, skip_settings=True))


@command(app, "eval")
def eval_cmd(
    drafter: str = typer.Option(..., "--drafter", help=DRAFTER_HELP),
    store: Path = typer.Option(..., "--store", help=STORE_HELP),
    model: str = MODEL,
    split: str = typer.Option("val", help="Which part of the data. Here: val (the run's held-out samples) or all "
                              "(training samples included)."),
    draft_length: int = typer.Option(DRAFT_LENGTH, NUM_SPEC, "-k", help=draft_length_help(
        "Here: the positions measured (1..7); τ is given for every K up to it.")),
    out: Optional[Path] = typer.Option(None, "--out", help=OUT_HELP + " Here: the results JSON (the report and "
                                       "the model card read RUN/eval.json)."),
    as_json: bool = AS_JSON, trust_remote_code: bool = TRUST,
):
    """τ (tokens per target forward) from stored hidden states: per-position acceptance, seconds."""
    from specdraft.analysis.evaluate import evaluate, format_result
    from specdraft.io import write_json

    check_out(out, [drafter, store], ".json")
    result = evaluate(drafter, store, model=model, split=split, steps=draft_length, trust_remote_code=trust_remote_code)
    say(result["warnings"])
    print(json.dumps(result, indent=2) if as_json else format_result(result))
    if out is not None:
        write_json(out, result)
        say(f"eval -> {out}")


@command(app)
def bench(
    model: str = MODEL,
    drafter: Optional[str] = typer.Option(None, "--drafter", help=DRAFTER_HELP + " Here: 'untrained[:N]' = "
                                          "random (timing only)."),
    prompts: str = typer.Option("builtin-holdout", "--prompts", help="jsonl with `messages` (user turns = prompt), "
                                "or builtin-holdout."),
    methods: str = typer.Option("greedy,plain,ngram,eagle3", "--methods", help="Comma list of greedy (transformers "
                                "generate), plain (specdraft's loop, no drafter), ngram, eagle3, eagle3-tree, ..."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help=MAX_NEW_TOKENS_HELP + " Here: per prompt."),
    num_speculative_tokens: Optional[str] = typer.Option(None, NUM_SPEC, "-k", help=draft_length_help(
        "Here: or auto, the default for a drafter's chain: K from measured costs and acceptance, K=0 (plain "
        "decoding) where no chain pays.")),
    draft_stop: Optional[str] = DRAFT_STOP,
    rounds: int = typer.Option(3, "--rounds", help="Timing rounds, the order rotated per round; the medians count. "
                               "Here: each runs every method on every prompt."),
    tree: Optional[str] = typer.Option(None, "--tree", help=TREE_HELP + " Here: for eagle3-tree (default 4,4,16)."),
    ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN,
    limit: Optional[int] = typer.Option(None, "--limit", help="Use the first N. Here: prompts (builtin-holdout: 32)."),
    out: Optional[Path] = typer.Option(None, "--out", help=OUT_HELP + " Here: the results JSON and a .png chart."),
    as_json: bool = AS_JSON,
    time_split: bool = typer.Option(False, "--time-split", help="Print the draft / verify / other time split."),
    device: str = DEVICE, compute_dtype: str = COMPUTE_DTYPE, trust_remote_code: bool = TRUST,
):
    """Wall-clock speed of greedy, plain (specdraft's loop, no drafter), n-gram and drafters on the same
    prompts, in interleaved rounds (median and spread per method)."""
    from specdraft.infer import bench as B
    from specdraft.io import write_json

    check_out(out, [prompts, drafter], ".json")
    if out is not None:
        check_out(out.with_suffix(".png"), [prompts, drafter], ".png")
    report = B.run_bench(model, drafter, prompts, methods, max_new_tokens, num_speculative_tokens, draft_stop, rounds,
                         tree, (ngram_min, ngram_max), limit, device, compute_dtype, trust_remote_code)
    say(report["warnings"])
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        Console().print(B.bench_table(report))
    if time_split:
        say(B.time_split_lines(report))
    if out is not None:
        write_json(out, report)
        B.plot(report, out.with_suffix(".png"))
        say(f"bench -> {out}, {out.with_suffix('.png')}")


@command(app)
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="User message (the chat template is applied)."),
    model: str = MODEL,
    drafter: Optional[str] = typer.Option(None, "--drafter", help=DRAFTER_HELP + " Here: 'untrained[:N]' = "
                                          "random (timing only)."),
    method: str = typer.Option("eagle3", "--method", help="greedy (no drafting), ngram, or the drafter's family "
                               "(eagle3, peagle, ...: `specdraft info` lists them)."),
    num_speculative_tokens: Optional[str] = typer.Option(None, NUM_SPEC, "-k", help=draft_length_help(
        "Here: or auto, the default for a drafter's chain: K from measured costs and acceptance, K=0 (plain "
        "decoding) where no chain pays.")),
    draft_stop: Optional[str] = DRAFT_STOP,
    tree: Optional[str] = typer.Option(None, "--tree", help=TREE_HELP + " Here: greedy only."),
    temperature: float = typer.Option(0.0, help=TEMPERATURE_HELP + " Here: >0 samples; rejection sampling keeps the "
                                      "target's distribution."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass."),
    seed: int = typer.Option(0, help=SEED_HELP + " Here: sampling."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help=MAX_NEW_TOKENS_HELP),
    ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN, device: str = DEVICE, compute_dtype: str = COMPUTE_DTYPE,
    as_json: bool = AS_JSON, trust_remote_code: bool = TRUST,
):
    """Speculative generation for one prompt: streams the answer, then tokens/s and τ."""
    from specdraft.infer.generate import generate_one
    from specdraft.infer.sampling import Sampling

    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
    result, name = generate_one(prompt, model, drafter, method, num_speculative_tokens, draft_stop, tree, sampling,
                                max_new_tokens, (ngram_min, ngram_max), device, compute_dtype, trust_remote_code,
                                stream=not as_json)
    if as_json:
        return print(json.dumps(result))
    sys.stdout.write("\n")
    say(f"{result['new_tokens']} tokens, {result['tokens_per_s']:.1f} tokens/s, τ {result['accept_len']:.2f} ({name})")


@command(app, "plan")
def plan_cmd(drafter: Optional[Path] = typer.Option(None, "--drafter", help=DRAFTER_HELP + " Here: to time a draft step."),
             model: str = MODEL,
             accept: Optional[str] = typer.Option(None, "--accept", help="eval/bench JSON, metrics.jsonl, or rates "
                                                  "0.8,0.6,..."),
             store: Optional[Path] = typer.Option(None, "--store", help=STORE_HELP + " Here: acceptance is measured on it."),
             verify_ms: Optional[str] = typer.Option(None, "--verify-ms", help="Verify latency for 1..K+1 tokens (ms), "
                                                     "or one value for all."),
             draft_ms: Optional[float] = typer.Option(None, "--draft-ms", help="Drafter step latency (ms)."),
             max_k: int = typer.Option(LONGEST_CHAIN, "--max-k", help="Longest draft chain considered (as -k auto's)."),
             context: int = typer.Option(512, help="KV cache length for the verify measurement."),
             rounds: int = typer.Option(3, "--rounds", help="Timing rounds, the order rotated per round; the medians "
                                        "count. Here: each times every verify length and the draft step."),
             run: Optional[Path] = typer.Option(None, "--run", help="Run folder: the result and a journal entry go there."),
             out: Optional[Path] = typer.Option(None, "--out", help=OUT_HELP + " Here: the plan JSON."),
             as_json: bool = AS_JSON, trust_remote_code: bool = TRUST):
    """Choose the number of draft tokens from acceptance per position and draft/verify cost."""
    from specdraft.analysis import plan

    check_out(out, [accept, drafter, store], ".json")
    result = plan.run(drafter=drafter, model=model, accept=accept, data=store,
                      verify_ms=parse_floats(verify_ms, "--verify-ms"), draft_ms=draft_ms, k_max=max_k,
                      context=context, run=run, out=out, trust_remote_code=trust_remote_code, rounds=rounds)
    say(result.get("warnings", []))
    print(json.dumps(result, indent=2) if as_json else plan.format_plan(result))


@command(app, "probe")
def probe_cmd(vocab: Optional[List[Path]] = typer.Option(None, "--vocab", help=VOCAB_HELP + " Here: two "
                                                           "mappings A and B (vocab file or drafter folder)."),
              model: Optional[List[str]] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Here: two (A, "
                                                        "B) for the hidden-state probe, one for --drafter."),
              prepared: Optional[Path] = typer.Option(None, "--prepared", help=PREPARED_HELP + " Here: both targets read it."),
              drafter: Optional[Path] = typer.Option(None, "--drafter", help=DRAFTER_HELP + " Here: for the direct "
                                                     "acceptance probe."),
              samples: int = typer.Option(32, help="Samples of --prepared to run."),
              tokens_per_sample: int = typer.Option(512, "--tokens-per-sample", help="Tokens of each sample read."),
              draft_length: int = typer.Option(DRAFT_LENGTH, NUM_SPEC, "-k", help=draft_length_help(
                  "Here: the positions the direct probe measures (1..7).")),
              run: Optional[Path] = typer.Option(None, "--run", help="Run folder: the result and a journal entry go there."),
              out: Optional[Path] = typer.Option(None, "--out", help=OUT_HELP + " Here: the result JSON."),
              as_json: bool = AS_JSON, trust_remote_code: bool = TRUST):
    """Before fine-tuning: mapping overlap, hidden-state similarity of two targets, the drafter as it is."""
    from specdraft.analysis import probe

    check_out(out, [*(vocab or []), prepared, drafter], ".json")
    results = probe.run(vocabs=vocab or [], models=model or [], data=prepared, drafter=drafter, samples=samples,
                        max_tokens=tokens_per_sample, steps=draft_length, run=run, out=out,
                        trust_remote_code=trust_remote_code)
    for r in results:
        print(json.dumps(r, indent=2) if as_json else probe.format_result(r))


@command(app, "export")
def export_cmd(
    run_or_ckpt: Path = typer.Argument(..., help="Checkpoint folder, or a run folder WS/runs/NAME (best/, else newest epoch)."),
    fmt: str = typer.Option("speculators", "--format", help="speculators (vLLM) or sglang."),
    out: Path = typer.Option(..., "--out", help=OUT_HELP + " Here: the folder the serving engine loads."),
    weights_dtype: str = typer.Option("bfloat16", "--weights-dtype", help="Dtype of the exported weights: bfloat16 "
                                      "(what vLLM/SGLang serve), float16 or float32."),
    no_embeddings: bool = typer.Option(False, "--no-embeddings", help="Drop embed_tokens (engines then use the "
                                       "target's); refused unless they equal the target's (--model)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Here: to check --no-embeddings "
                                        "against."),
    num_speculative_tokens: int = typer.Option(DRAFT_LENGTH, NUM_SPEC, "-k", help=draft_length_help(
        "Here: written into the speculators config; the model card quotes τ at it.")),
    as_json: bool = AS_JSON,
):
    """Write the drafter in the layout a serving engine loads, with a model card (docs/serving.md)."""
    from specdraft.formats.checkpoints import export, export_line
    from specdraft.io import own_folder

    with own_folder(out, "export"):
        summary = export(run_or_ckpt, out, fmt, speculative_tokens=num_speculative_tokens, dtype=weights_dtype,
                         embeddings=not no_embeddings, model=model)
    print(json.dumps(summary, indent=2)) if as_json else say(export_line(summary, out, fmt))


@command(app, "import")
def import_cmd(src: Path = typer.Argument(..., help="Drafter folder: speculators, SGLang, or official EAGLE-3 layout."),
               out: Path = typer.Option(..., "--out", help=OUT_HELP + " Here: a drafter folder in our layout."),
               as_json: bool = AS_JSON):
    """Read a drafter in any supported layout and write it in ours."""
    from specdraft.formats.checkpoints import import_checkpoint, import_lines
    from specdraft.io import own_folder

    with own_folder(out, "import"):
        summary = import_checkpoint(src, out)
    print(json.dumps(summary, indent=2)) if as_json else say(import_lines(summary, src, out))


@command(app, "report")
def report_cmd(runs: List[Path] = typer.Argument(..., help="Run folders."),
               out: Optional[Path] = typer.Option(None, "--out", help=OUT_HELP + " Here: the HTML file (default: "
                                                  "report.html in the first run folder).")):
    """One self-contained HTML page that leads with τ, speedup and losslessness; then bench/eval
    tables, the export's serve commands, stage timings, curves, journal and config."""
    from specdraft.analysis import report

    check_out(out, runs, ".html")
    say(f"report -> {report.build(runs, out)}")


@command(app, "compare")
def compare_cmd(runs: List[Path] = typer.Argument(..., help="Run folders (or their metrics.jsonl)."),
                out: Optional[Path] = typer.Option(None, "--out", help=OUT_HELP + " Here: a folder for compare.md "
                                                   "and curves.png."),
                metric: Optional[List[str]] = typer.Option(None, "--metric", help="Table metrics (repeatable)."),
                baseline: Optional[Path] = typer.Option(None, "--baseline", help=BASELINE_HELP + " Here: flag runs that stay behind it."),
                margin: float = typer.Option(0.05, help="Behind-baseline margin on full_acc_0 (absolute)."),
                as_json: bool = AS_JSON):
    """Validation metrics per epoch side by side, and curves aligned by tokens seen."""
    from specdraft.analysis import compare

    result = compare.compare(runs, out, tuple(metric) if metric else compare.DEFAULT_TABLE_METRICS,
                             baseline=baseline, margin=margin)
    print(json.dumps(result, indent=2)) if as_json else compare.print_result(result)


@command(journal_app, "add")
def journal_add(run: Path = typer.Argument(..., help="Run folder, e.g. WS/runs/NAME."),
                text: str = typer.Argument(..., help="What was hypothesised, found or decided."),
                kind: str = typer.Option(..., "--kind", help="hypothesis, result, decision, warning or probe.")):
    """Append a timestamped entry to RUN/journal.md."""
    from specdraft import journal

    entry = journal.add(run, kind, text)
    say(f"journal {entry.time} {entry.kind} -> {journal.journal_path(run)}")


@command(app)
def recipe(model: str = typer.Argument(..., help=MODEL_HELP),
           profile: Optional[str] = typer.Option(None, help=PROFILE_HELP + " Here: default "
                                                 "quick (src/specdraft/recipes/, see docs/recipes.md)."),
           config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP + " Here: "
                                                 "instead of --profile (copy src/specdraft/recipes/quick.yaml)."),
           workspace: Optional[Path] = typer.Option(None, "--workspace", help=WORKSPACE_HELP + " Here: "
                                                    "default ws/<model>-<recipe name>."),
           conversations: str = typer.Option("builtin", "--conversations", help=CONVERSATIONS_HELP),
           engine: str = ENGINE):
    """Every stage, prepare to report, for any target: the recipe behind `make demo`."""
    from specdraft.data.vllm_engine import engine_options
    from specdraft.pipeline import recipe_choice, run_recipe

    chosen, ws = recipe_choice(model, profile, config, workspace)
    run_recipe(model, ws, recipe=chosen, data=conversations, engine=engine_options(engine).name)


@command(app)
def demo(workspace: Path = typer.Option(Path("ws/demo"), "--workspace", help=WORKSPACE_HELP),
         profile: str = typer.Option("quick", help=PROFILE_HELP + " Here: quick takes about 20 min on 2 cores."),
         engine: str = ENGINE):
    """The end-to-end job on the embedded default target (SmolLM2-135M-Instruct)."""
    from specdraft.data.vllm_engine import engine_options
    from specdraft.pipeline import run_demo

    run_demo(workspace, recipe=profile, engine=engine_options(engine).name)


def main() -> None:
    """Entry point: bad input becomes one line on stderr and exit code 2, never a traceback.

    OS errors that no writer turned into a message (a full disk, a path that is a folder, no
    permission) are bad input too: one line naming the path. SPECDRAFT_DEBUG=1 shows the traceback.
    Output to a file or pipe is never wrapped (a log keeps paths and tables whole)."""
    import os

    from specdraft.io import os_error_line

    if not sys.stderr.isatty() and "--help" not in sys.argv:
        os.environ.setdefault("COLUMNS", "1000")
    try:
        code = app(standalone_mode=False)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        sys.exit(130)
    except Exception as e:
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):   # click's usage errors, on one line too
            help_only = type(e).__name__ == "NoArgsIsHelpError"
            console.print(("" if help_only else "error: ") + e.format_message(), highlight=False, soft_wrap=True,
                          markup=False)
            sys.exit(e.exit_code)
        line = str(e) if isinstance(e, SpecdraftError) else os_error_line(getattr(e, "filename", None), e)
        if line is None:
            raise   # a bug, not bad input: the traceback is what helps
        if os.environ.get("SPECDRAFT_DEBUG") == "1":
            console.print_exception()
        console.print(f"[red]error:[/] {line}", highlight=False, soft_wrap=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
