"""The `specdraft` command: one sub-command per stage. Wiring only: parse, call the stage, print.
The flags' vocabulary (shared options, bounds, help) is specdraft/flags.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from specdraft.defaults import DRAFT_LENGTH
from specdraft.errors import SpecdraftError
from specdraft.flags import (AS_JSON, BUDGET_MINUTES, CHAT_TEMPLATE_KWARGS, PREPARE_MAX_LENGTH, REGEN_MAX_NEW_TOKENS,
                             CAPTURE_DTYPE, CONFIG_HELP, CONTEXT_BUCKETS,
                             CONVERSATIONS_HELP, DEVICE, REGEN_DTYPE, DRAFTER_HELP,
                             ENGINE, ENGINE_ARGS, MODEL, MODEL_HELP, NUM_SPEC, PART_HELP,
                             PREPARED_HELP, PROFILE_HELP, SEED_HELP, STORE_FORMAT_HELP,
                             STORE_HELP, TEMPERATURE_HELP, TP, TRUST, VERSION,
                             WORKSPACE_HELP, PlainCommand, check_out, command,
                             draft_length_help, numbers_checked_first, out_option,
                             parse_layers, plain_app, run_cli, say)
from specdraft import cli_analysis as analysis_commands
from specdraft import cli_infer as infer_commands
from specdraft.train.command import train as train_command

app = plain_app("Train, evaluate and ship speculative-decoding drafters (EAGLE-3 and its kin).")
vocab_app = plain_app("Draft vocabulary: build, diff, remap.")
store_app = plain_app("Hidden-state stores: convert between store formats.")
app.add_typer(store_app, name="store")
app.add_typer(vocab_app, name="vocab")
journal_app = analysis_commands.journal_app
app.add_typer(journal_app, name="journal")
analysis_commands.register(app)


@app.callback()
def root(version: bool = VERSION):
    """Train, evaluate and ship speculative-decoding drafters (EAGLE-3 and its kin)."""


@command(app)
def info(model: str = MODEL, trust_remote_code: bool = TRUST, as_json: bool = AS_JSON):
    """What specdraft sees in a target. Architecture, layers, hidden size, vocab, tied lm_head, chat
    template, default aux layers, and the drafter families `train --family` takes."""
    from specdraft.families import names
    from specdraft.targets import info as target_info

    data = {**target_info(model, trust_remote_code), "drafter_families": names()}
    print(json.dumps(data, indent=2) if as_json else "\n".join(f"{k:20s} {v}" for k, v in data.items()))


@command(app)
def prepare(
    conversations: str = typer.Option(..., "--conversations", help=CONVERSATIONS_HELP),
    out: Path = out_option("the prepared data folder, e.g. WS/data.", required=True),
    model: str = MODEL,
    regenerate: bool = typer.Option(False, "--regenerate", help="Replace assistant turns with the target's own answers."),
    temperature: float = typer.Option(0.0, help=TEMPERATURE_HELP + " Here: of the regenerated answers."),
    max_new_tokens: Optional[int] = REGEN_MAX_NEW_TOKENS, max_length: Optional[int] = PREPARE_MAX_LENGTH,
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
    follow_ups: float = typer.Option(0.0, "--follow-ups", help="Share (0..1) of the self-written conversations "
                                     "that get a second user turn, which the target writes after its answer."),
    compute_dtype: str = REGEN_DTYPE, budget_minutes: Optional[float] = BUDGET_MINUTES,
    chat_template_kwargs: Optional[str] = CHAT_TEMPLATE_KWARGS):
    """Render conversations for training. The chat template applied, the assistant tokens' loss mask
    built; with --regenerate the answers are the target's own."""
    from specdraft.data.prepare import prepare as run_prepare, summary_lines
    from specdraft.data.prepared import parse_part
    from specdraft.data.vllm_engine import engine_options
    from specdraft.outputs import own_folder

    share, opts = parse_part(part), engine_options(engine, tensor_parallel_size, engine_args, endpoint)
    with own_folder(out, "prepare"):
        summary = run_prepare(model=model, source=conversations, out=out, regenerate=regenerate,
                              temperature=temperature, max_new_tokens=max_new_tokens, max_length=max_length,
                              min_assistant_tokens=min_assistant_tokens, dedup=dedup, limit=limit,
                              batch_size=batch_size, split=split, seed=seed, trust_remote_code=trust_remote_code,
                              engine=opts, part=share, follow_ups=follow_ups, compute_dtype=compute_dtype,
                              budget_minutes=budget_minutes, template_kwargs=chat_template_kwargs)
    say(summary_lines(summary, out))


@command(app)
def capture(
    prepared: Optional[Path] = typer.Option(None, "--prepared", help=PREPARED_HELP + " Here: required, but for --verify."),
    out: Path = out_option("the store folder, e.g. WS/hidden.", required=True),
    model: str = MODEL,
    layers: Optional[str] = typer.Option(None, help="Aux layer ids, any number, e.g. 2,15,27 (default [2, L//2, L-3])."),
    store_dtype: str = typer.Option("bfloat16", "--store-dtype", help="Dtype the bf16 store format keeps: "
                                    "bfloat16, float16 or float32."),
    batch_tokens: int = typer.Option(4096, help="Tokens per forward (length-bucketed batches)."),
    shard_tokens: int = typer.Option(65536, help="Tokens per shard file."),
    resume: bool = typer.Option(False, "--resume", help="Continue where an interrupted run stopped."),
    verify: bool = typer.Option(False, "--verify", help="Only re-hash the shards of --out and report."),
    compute_dtype: str = CAPTURE_DTYPE, trust_remote_code: bool = TRUST, engine: str = ENGINE, device: str = DEVICE,
    tensor_parallel_size: int = TP, engine_args: Optional[str] = ENGINE_ARGS,
    store_format: str = typer.Option("bf16", "--store-format", help=STORE_FORMAT_HELP),
    part: Optional[str] = typer.Option(None, "--part", help=PART_HELP + " Here: train on the parts "
                                       "with --store A --store B ..."),
):
    """Store the target's hidden states per token. Its aux layers' states and its pre-norm last layer
    output, in shards that train reads."""
    from specdraft.data import capture as cap
    from specdraft.data.prepared import parse_part
    from specdraft.data.store_formats import check_format
    from specdraft.data.vllm_engine import engine_options
    from specdraft.outputs import own_folder

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
                               store_format=store_format, part=share, device=device)
    say(f"captured {manifest['num_samples']} samples, {manifest['num_tokens']} tokens in "
        f"{len(manifest['shards'])} shards -> {out}")


@command(store_app, "convert")
def store_convert(
    src: Path = typer.Argument(..., help="A finished store (WS/hidden)."),
    store_format: str = typer.Option(..., "--store-format", help=STORE_FORMAT_HELP),
    out: Path = out_option("a new, empty store folder; the source is kept.", required=True),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Here: for compact, the one the "
                                        "store was captured from (default: the one its manifest names)."),
    trust_remote_code: bool = TRUST,
):
    """Re-write a store in another store format. Same samples, same shards."""
    from specdraft.data.store_convert import convert_store
    from specdraft.outputs import own_folder

    with own_folder(out, "store convert"):
        manifest = convert_store(src, out, store_format, model, trust_remote_code)
    say(f"converted {manifest['num_samples']} samples, {manifest['num_tokens']} tokens to {store_format} in "
        f"{len(manifest['shards'])} shards -> {out}")


@command(vocab_app, "build")
def vocab_build(
    prepared: Optional[Path] = typer.Option(None, "--prepared", help=PREPARED_HELP + " Here: count its tokens (or "
                                            "--store's)."),
    store: Optional[list[Path]] = typer.Option(None, "--store", help=STORE_HELP + " Here: count its tokens (or "
                                               "--prepared's); repeat it to count several stores together."),
    size: int = typer.Option(..., "--size", help="Draft vocabulary size N."),
    out: Path = out_option("the vocab file, e.g. WS/vocab.safetensors.", required=True),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Here: for its vocab size "
                                        "(default: the one named in the data)."),
):
    """Build the draft vocabulary. The top-N target tokens by frequency over loss-masked tokens, as
    d2t offsets / t2d mask."""
    from specdraft import vocab
    from specdraft.outputs import check_output_file

    if (prepared is None) == (not store):
        raise SpecdraftError("--prepared and --store: pick one (the tokens are counted in one of them)" if store else
                             "--prepared WS/data or --store WS/hidden is required: the tokens to count")
    check_output_file(out, [*(store or [prepared]), model], ".safetensors")
    summary = vocab.build_from_data(store or prepared, size, out, model=model,
                                    kind="prepared" if prepared is not None else "store")
    say(vocab.build_summary_lines(summary, out))


@command(vocab_app, "diff")
def vocab_diff(
    a: Path = typer.Argument(..., help="Mapping A (.safetensors or drafter folder)."),
    b: Path = typer.Argument(..., help="Mapping B."), as_json: bool = AS_JSON,
):
    """Compare two draft vocabularies. Sizes, token-set overlap, positional matches, rows that carry
    over from A to B."""
    from specdraft import vocab

    d = vocab.diff(vocab.load(a), vocab.load(b))
    print(json.dumps(d, indent=2) if as_json else vocab.format_diff(d))


@command(vocab_app, "remap")
def vocab_remap(
    a: Path = typer.Argument(..., help="Source mapping A."),
    b: Path = typer.Argument(..., help="Destination mapping B."),
    out: Optional[Path] = out_option("the permutation (safetensors)."), as_json: bool = AS_JSON,
):
    """Map one draft vocabulary onto another. The row permutation from A's draft ids to B's, and B's
    rows that have no source."""
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
    store: List[Path] = typer.Option(..., "--store", help=STORE_HELP + " Here: repeated for a run over several."),
    model: str = MODEL,
    split: str = typer.Option("val", help="Which part of the data. Here: val (the run's held-out samples) or all "
                              "(training samples included)."),
    draft_length: int = typer.Option(DRAFT_LENGTH, NUM_SPEC, "-k", help=draft_length_help(
        "Here: the positions measured (1..7); τ is given for every K up to it.")),
    out: Optional[Path] = out_option("the results JSON (the report and the model card read RUN/eval.json)."),
    as_json: bool = AS_JSON, trust_remote_code: bool = TRUST, context_buckets: Optional[str] = CONTEXT_BUCKETS,
):
    """τ from stored hidden states, in seconds. τ (tokens per target forward) at every K up to -k,
    and the per-position acceptance behind it."""
    from specdraft.analysis.evaluate import evaluate, format_result
    from specdraft.io import write_json

    check_out(out, [drafter, *store], ".json", "eval")
    result = evaluate(drafter, store[0] if len(store) == 1 else store, model=model, split=split, steps=draft_length,
                      trust_remote_code=trust_remote_code, context_buckets=context_buckets)
    say(result["warnings"])
    print(json.dumps(result, indent=2) if as_json else format_result(result))
    if out is not None:
        write_json(out, result)
        say(f"eval -> {out}")


infer_commands.register(app)       # bench, generate: after eval, before export


@command(app, "export")
def export_cmd(
    run_or_ckpt: Path = typer.Argument(..., help="Checkpoint folder, or a run folder WS/runs/NAME (best/, else newest epoch)."),
    fmt: str = typer.Option("speculators", "--format", help="speculators (vLLM) or sglang."),
    out: Path = out_option("the folder the serving engine loads.", required=True),
    weights_dtype: str = typer.Option("bfloat16", "--weights-dtype", help="Dtype of the exported weights: bfloat16 "
                                      "(what vLLM/SGLang serve), float16 or float32."),
    no_embeddings: bool = typer.Option(False, "--no-embeddings", help="Drop embed_tokens (engines then use the "
                                       "target's); refused unless they equal the target's (--model)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Here: to check --no-embeddings "
                                        "against."),
    num_speculative_tokens: Optional[int] = typer.Option(None, NUM_SPEC, "-k", help=draft_length_help(
        "Here: written into the speculators config; default the drafter's own, the draft positions it was trained on "
        "(its run's TTT steps; at most a block's slots), never a machine's measured choice.")),
    as_json: bool = AS_JSON,
):
    """Write the drafter for a serving engine. In the layout vLLM or SGLang loads, with a model card
    (docs/serving.md)."""
    from specdraft.formats.checkpoints import export, export_line
    from specdraft.outputs import own_folder

    if model is not None and not no_embeddings:      # read only to check --no-embeddings: never taken as applied
        raise SpecdraftError(f"--model {model}: export reads it only to check --no-embeddings against; add "
                             "--no-embeddings or drop --model (the drafter names its target itself)")
    with own_folder(out, "export"):
        summary = export(run_or_ckpt, out, fmt, speculative_tokens=num_speculative_tokens, dtype=weights_dtype,
                         embeddings=not no_embeddings, model=model)
    print(json.dumps(summary, indent=2)) if as_json else say(export_line(summary, out, fmt))


@command(app, "import")
def import_cmd(
    src: Path = typer.Argument(..., help="Drafter folder: speculators, SGLang, or official EAGLE-3 layout."),
    out: Path = out_option("a drafter folder in our layout.", required=True), as_json: bool = AS_JSON,
):
    """Read a drafter in any supported layout. It is written in ours."""
    from specdraft.formats.checkpoints import import_checkpoint, import_lines
    from specdraft.outputs import own_folder

    with own_folder(out, "import"):
        summary = import_checkpoint(src, out)
    print(json.dumps(summary, indent=2)) if as_json else say(import_lines(summary, src, out))


@command(app)
def recipe(
    model: str = typer.Argument(..., help=MODEL_HELP),
    profile: Optional[str] = typer.Option(None, help=PROFILE_HELP + " Here: default quick (src/specdraft/recipes/, "
                                          "see docs/recipes.md)."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP + " Here: instead of --profile (copy "
                                          "src/specdraft/recipes/quick.yaml)."),
    workspace: Optional[Path] = typer.Option(None, "--workspace", help=WORKSPACE_HELP + " Here: default "
                                             "ws/<model>-<recipe name>."),
    conversations: Optional[str] = typer.Option(None, help=CONVERSATIONS_HELP + " Here: the recipe's."), engine: str = ENGINE,
):
    """Every stage, prepare to report, for any target. The recipe behind `make demo`."""
    from specdraft.data.vllm_engine import engine_options
    from specdraft.pipeline import recipe_choice, run_recipe

    chosen, ws = recipe_choice(model, profile, config, workspace)
    run_recipe(model, ws, recipe=chosen, data=conversations, engine=engine_options(engine).name)


@command(app)
def demo(
    workspace: Path = typer.Option(Path("ws/demo"), "--workspace", help=WORKSPACE_HELP),
    profile: str = typer.Option("quick", help=PROFILE_HELP + " Here: quick takes about 20 min on 2 cores."),
    engine: str = ENGINE,
):
    """The whole pipeline on the default target. SmolLM2-135M-Instruct, embedded in the install."""
    from specdraft.data.vllm_engine import engine_options
    from specdraft.pipeline import run_demo

    run_demo(workspace, recipe=profile, engine=engine_options(engine).name)


def main() -> None:
    """Entry point: bad input is one line on stderr and exit 2, never a traceback (flags.run_cli)."""
    run_cli(app)


if __name__ == "__main__":
    main()
