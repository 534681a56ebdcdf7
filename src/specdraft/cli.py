"""The `specdraft` command: one sub-command per stage. No logic here: parse, call, print."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from specdraft.errors import SpecdraftError, renamed
from specdraft.train.command import train as train_command
from specdraft.train.config import MAX_TTT_STEPS

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train, adapt, evaluate and ship EAGLE-3 drafters.")
vocab_app = typer.Typer(no_args_is_help=True, help="Draft vocabulary: build, diff, remap.")
app.add_typer(vocab_app, name="vocab")
console = Console(stderr=True)

MODEL = typer.Option("default", "--model", "-m", help="Hub id, local folder, .gguf file, or 'default' (SmolLM2-135M-Instruct).")
TRUST = typer.Option(False, "--trust-remote-code", help="Allow the model's own Python code (only for models you trust).")
ENGINE = typer.Option("auto", "--engine", help="Runs the target over data: hf (transformers, in this process), vllm, or auto (vLLM when installed and a CUDA device is present).")
TP = typer.Option(1, "--tensor-parallel-size", help="vLLM tensor parallelism (GPUs per engine).")
ENGINE_ARGS = typer.Option(None, "--engine-args", help="""JSON object passed to vllm.LLM(...), e.g. '{"max_model_len": 4096, "gpu_memory_utilization": 0.85}'.""")
AS_JSON = typer.Option(False, "--json", help="Print JSON to stdout (files are written with --out).")
NUM_SPEC = "--num-speculative-tokens"   # vLLM's num_speculative_tokens: the draft length, everywhere
DRAFT_STOP_HELP = ("Confidence stop for the eagle3 chain: end a draft when the drafter's confidence in it (the "
                   "product of its top-1 probabilities) falls below P in [0, 1]; auto = the threshold where one "
                   "more draft costs more than it is expected to earn (cost model). Never changes the output.")



def old_name(name: str):
    """A deprecated option name kept for one release (hidden; errors.renamed prints the note)."""
    return typer.Option(None, name, hidden=True)


def required(value, option: str, what: str):
    if value is None:
        raise SpecdraftError(f"{option} is required: {what}")
    return value


def version_callback(value: bool) -> None:
    if value:
        from specdraft import __version__

        print(f"specdraft {__version__}")
        raise typer.Exit()


@app.callback()
def root(version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                      help="Print the version and exit.")):
    """Train, adapt, evaluate and ship EAGLE-3 drafters."""


def parse_layers(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecdraftError(f"--layers {text!r}: expected comma-separated integers such as 2,15,27") from None


# The numeric options of every command (by parameter name) and the values they accept, checked
# before the command does anything (no model loads, no file is read): `--limit -1` kept all prompts
# but the last, `--seed 2**70` overflowed torch.manual_seed after the model loaded. Train's settings
# are bounded in RunConfig (train/config.py) instead; tests/test_flags.py feeds each option here a
# value beyond its bounds, from the commands' signatures.
COUNT_MAX = 2**31 - 1          # counts of tokens, samples, prompts: what an int32 index holds
SEED_MAX = 2**32 - 1           # torch.manual_seed and numpy take 64 bits; the loader mixes the seed further
K_MAX = 256                    # draft tokens per round: far beyond any drafter's use, far below a typo's


def between(low, high):
    return (lambda v: low <= v <= high), f"must be {low}..{high}"


NUMBER_BOUNDS = {
    "max_new_tokens": between(1, COUNT_MAX), "max_length": between(2, COUNT_MAX),
    "min_assistant_tokens": between(1, COUNT_MAX), "limit": between(1, COUNT_MAX),
    "batch_size": between(1, COUNT_MAX), "batch_tokens": between(1, COUNT_MAX),
    "shard_tokens": between(1, COUNT_MAX), "samples": between(1, COUNT_MAX), "max_tokens": between(2, COUNT_MAX),
    "context": between(1, COUNT_MAX), "size": between(1, COUNT_MAX), "seed": between(0, SEED_MAX),
    "rounds": between(1, 10_000), "tensor_parallel_size": between(1, 1024), "nproc": between(1, 1024),
    "num_speculative_tokens": between(1, K_MAX), "speculative_tokens": between(1, K_MAX), "k_max": between(1, K_MAX),
    "steps": between(1, MAX_TTT_STEPS), "ngram_max": between(1, 64), "ngram_min": between(1, 64),
    "temperature": ((lambda v: v >= 0), "must be >= 0 (0 = greedy)"),
    "top_p": ((lambda v: 0 < v <= 1), "must be in (0, 1]"),
    "margin": ((lambda v: v >= 0), "must be >= 0"),
    "draft_ms": ((lambda v: v > 0), "must be > 0"),
}


def option_flag(name: str) -> str:
    return NUM_SPEC if name == "num_speculative_tokens" else "--" + name.replace("_", "-")


def check_numbers(values: dict, skip=()) -> None:
    """Refuse a numeric option beyond its NUMBER_BOUNDS, or not finite, in one line naming it."""
    import math

    for name, value in values.items():
        if name in skip or name not in NUMBER_BOUNDS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue   # unset, or a text option parsed later (-k auto)
        ok, rule = NUMBER_BOUNDS[name]
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecdraftError(f"{option_flag(name)} {value}: must be a finite number")
        if not ok(value):
            raise SpecdraftError(f"{option_flag(name)} {value}: {rule}")


def numbers_checked_first(command):
    """Wrap a command so that check_numbers runs on its options before its body."""
    import dataclasses
    import functools

    from specdraft.train.config import RunConfig

    settings = {f.name for f in dataclasses.fields(RunConfig)}   # train's: RunConfig.check bounds them

    @functools.wraps(command)
    def checked(*args, **kwargs):
        check_numbers(kwargs, skip=settings if command is train_command else ())
        return command(*args, **kwargs)

    return checked


@app.command()
def info(model: str = MODEL, trust_remote_code: bool = TRUST,
         as_json: bool = AS_JSON):
    """Architecture, layers, hidden size, vocab, tied lm_head, chat template, default aux layers, and
    the drafter families `train --family` takes."""
    from specdraft.families import names
    from specdraft.targets import info as target_info

    data = {**target_info(model, trust_remote_code), "drafter_families": names()}
    if as_json:
        print(json.dumps(data, indent=2))
        return
    for k, v in data.items():
        print(f"{k:20s} {v}")


@app.command()
def prepare(
    conversations: Optional[str] = typer.Option(None, "--conversations", help="Conversations: jsonl/json/parquet file, a Hugging Face dataset id, 'builtin', or 'self:N' (the target writes N questions)."),
    out: Path = typer.Option(..., "--out", help="Output folder, e.g. WS/data."),
    model: str = MODEL,
    regenerate: bool = typer.Option(False, "--regenerate", help="Replace assistant turns with the target's own answers."),
    temperature: float = typer.Option(0.0, help="Regeneration temperature (0 = greedy)."),
    max_new_tokens: int = typer.Option(256, help="Regeneration length cap per assistant turn."),
    max_length: int = typer.Option(2048, help="Drop conversations longer than this many tokens."),
    min_assistant_tokens: int = typer.Option(1, help="Drop samples with fewer loss-masked tokens."),
    dedup: bool = typer.Option(True, "--dedup/--no-dedup", help="Drop duplicate conversations."),
    limit: Optional[int] = typer.Option(None, help="Keep at most this many samples."),
    batch_size: int = typer.Option(16, help="Regeneration batch size."),
    split: str = typer.Option("train", help="Dataset split for hub datasets."),
    seed: int = typer.Option(0, help="Seed for builtin prompts and sampling."),
    trust_remote_code: bool = TRUST,
    engine: str = ENGINE,
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Regenerate through a running `vllm serve` (OpenAI-compatible), e.g. http://HOST:8000/v1."),
    tensor_parallel_size: int = TP,
    engine_args: Optional[str] = ENGINE_ARGS,
    part: Optional[str] = typer.Option(None, "--part", help="I/N: keep only samples with index % N == I-1 (one of N nodes)."),
    data: Optional[str] = old_name("--data"),
):
    """Render conversations with the chat template and build the assistant-token loss mask."""
    from specdraft.data.prepare import prepare as run_prepare
    from specdraft.data.prepared import parse_part
    from specdraft.data.vllm_engine import engine_options

    share = parse_part(part)
    from specdraft.io import own_folder

    data = required(renamed(conversations, data, "--data", "--conversations"), "--conversations",
                    "a jsonl/json/parquet file, a Hugging Face dataset id, or builtin")
    opts = engine_options(engine, tensor_parallel_size, engine_args, endpoint)
    with own_folder(out, "prepare"):
        summary = run_prepare(model=model, source=data, out=out, regenerate=regenerate, temperature=temperature,
                              max_new_tokens=max_new_tokens, max_length=max_length,
                              min_assistant_tokens=min_assistant_tokens, dedup=dedup, limit=limit,
                              batch_size=batch_size, split=split, seed=seed, trust_remote_code=trust_remote_code,
                              engine=opts, part=share)
    counts = summary["counts"]
    dropped = ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in counts["dropped"].items() if n)
    console.print(f"[green]prepared[/] {counts['samples']} samples, {counts['tokens']} tokens "
                  f"({counts['loss_tokens']} trained) -> {out}" + (f" [dim](dropped: {dropped})[/]" if dropped else ""))


@app.command()
def capture(
    prepared: Optional[Path] = typer.Option(None, "--prepared", help="Prepared data folder (WS/data, from `specdraft prepare`)."),
    out: Path = typer.Option(..., "--out", help="Store folder (WS/hidden)."),
    model: str = MODEL,
    layers: Optional[str] = typer.Option(None, help="Aux layer ids, any number of them, e.g. 2,15,27 (default [2, L//2, L-3], EAGLE-3's 3)."),
    dtype: str = typer.Option("bfloat16", help="Stored dtype: bfloat16, float16 or float32."),
    batch_tokens: int = typer.Option(4096, help="Tokens per forward (length-bucketed batches)."),
    shard_tokens: int = typer.Option(65536, help="Tokens per shard file."),
    resume: bool = typer.Option(False, "--resume", help="Continue at the first missing shard."),
    verify: bool = typer.Option(False, "--verify", help="Only re-hash the shards of --out and report."),
    compute_dtype: str = typer.Option("float32", help="Dtype the target runs in: float32, bfloat16 or float16."),
    trust_remote_code: bool = TRUST,
    engine: str = ENGINE,
    tensor_parallel_size: int = TP,
    engine_args: Optional[str] = ENGINE_ARGS,
    store_format: str = typer.Option("bf16", "--store-format", help="How shards keep the hidden states: bf16 (--dtype, exact), fp8 (~0.5x), compact (int4 aux + the teacher's top-k, ~0.2x)."),
    part: Optional[str] = typer.Option(None, "--part", help="I/N: capture only samples with index % N == I-1 (one of N nodes); train on the parts with --store A --store B ..."),
    data: Optional[Path] = old_name("--data"),
):
    """Store the target's aux hidden states and pre-norm last layer output, per token."""
    from specdraft.data import capture as cap
    from specdraft.data.prepared import parse_part
    from specdraft.data.store_formats import check_format
    from specdraft.data.vllm_engine import engine_options

    check_format(store_format)
    share = parse_part(part)
    data = renamed(prepared, data, "--data", "--prepared")
    if verify:
        report = cap.verify_store(out)
        console.print(f"[green]ok[/] {report['shards']} shards, {report['samples']} samples, "
                      f"{report['tokens']} tokens verified in {out}")
        return
    if data is None:
        raise SpecdraftError("capture: --prepared WS/data is required (or pass --verify)")
    from specdraft.io import own_folder

    with own_folder(out, "capture"):
        manifest = cap.capture(model=model, data=data, out=out, layers=parse_layers(layers), dtype=dtype,
                               batch_tokens=batch_tokens, shard_tokens=shard_tokens, resume=resume,
                               trust_remote_code=trust_remote_code, compute_dtype=compute_dtype,
                               engine=engine_options(engine, tensor_parallel_size, engine_args),
                               store_format=store_format, part=share)
    console.print(f"[green]captured[/] {manifest['num_samples']} samples, {manifest['num_tokens']} tokens "
                  f"in {len(manifest['shards'])} shards -> {out}")


store_app = typer.Typer(no_args_is_help=True, help="Hidden-state stores: convert between store formats.")
app.add_typer(store_app, name="store")


@store_app.command("convert")
def store_convert(
    src: Path = typer.Argument(..., help="A finished store (WS/hidden)."),
    store_format: str = typer.Option(..., "--store-format", help="bf16, fp8 or compact."),
    out: Path = typer.Option(..., "--out", help="New store folder (empty); the source is kept."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="For compact: the target the store was captured from (default: the one its manifest names)."),
    trust_remote_code: bool = TRUST,
):
    """Re-write a store in another store format (same samples, same shards)."""
    from specdraft.data.store_convert import convert_store
    from specdraft.io import own_folder

    with own_folder(out, "store convert"):
        manifest = convert_store(src, out, store_format, model, trust_remote_code)
    console.print(f"[green]converted[/] {manifest['num_samples']} samples, {manifest['num_tokens']} tokens "
                  f"to {store_format} in {len(manifest['shards'])} shards -> {out}")


@vocab_app.command("build")
def vocab_build(
    prepared: Optional[Path] = typer.Option(None, "--prepared", help="Count tokens in prepared data (WS/data)..."),
    store: Optional[Path] = typer.Option(None, "--store", help="...or in a hidden-state store (WS/hidden)."),
    size: int = typer.Option(..., "--size", help="Draft vocabulary size N."),
    out: Path = typer.Option(..., "--out", help="Output file, e.g. WS/vocab.safetensors."),
    model: Optional[str] = typer.Option(None, "--model", help="Target (for its vocab size); default: the one named in the data."),
    data: Optional[Path] = old_name("--data"),
):
    """Top-N target tokens by frequency over loss-masked tokens, as d2t offsets / t2d mask."""
    from specdraft import vocab

    if prepared is not None and store is not None:
        raise SpecdraftError("--prepared and --store: pick one (the tokens are counted in one of them)")
    source = renamed(prepared if store is None else store, data, "--data", "--prepared or --store")
    kind = "prepared" if prepared is not None else "store" if store is not None else None
    from specdraft.io import check_output_file

    check_output_file(out, [source, model], ".safetensors")
    summary = vocab.build_from_data(required(source, "--prepared WS/data or --store WS/hidden", "the tokens "
                                             "to count"), size, out, model=model, kind=kind)
    console.print(f"[green]vocab[/] {summary['draft_vocab_size']} of {summary['target_vocab_size']} tokens, "
                  f"covers {summary['coverage']:.1%} of trained tokens -> {out}")


@vocab_app.command("diff")
def vocab_diff(a: Path = typer.Argument(..., help="Mapping A (.safetensors or drafter folder)."),
               b: Path = typer.Argument(..., help="Mapping B."),
               as_json: bool = AS_JSON):
    """Sizes, token-set overlap, positional matches, rows that carry over from A to B."""
    from specdraft import vocab

    d = vocab.diff(vocab.load(a), vocab.load(b))
    if as_json:
        print(json.dumps(d, indent=2))
    else:
        print(vocab.format_diff(d))


@vocab_app.command("remap")
def vocab_remap(a: Path = typer.Argument(..., help="Source mapping A."),
                b: Path = typer.Argument(..., help="Destination mapping B."),
                out: Optional[Path] = typer.Option(None, "--out", help="Write the permutation (safetensors)."),
                as_json: bool = AS_JSON):
    """Row permutation from A's draft ids to B's, and B's rows that have no source."""
    from specdraft import vocab
    from specdraft.io import check_output_file

    if out is not None:
        check_output_file(out, [a, b], ".safetensors")
    r = vocab.remap(vocab.load(a), vocab.load(b))
    if out is not None:
        vocab.save_remap(r, out)
    summary = {"carried": int((r.src >= 0).sum()), "unsourced": int((r.src < 0).sum()),
               "draft_vocab_size": int(r.src.numel())}
    print(json.dumps(summary, indent=2) if as_json else
          f"rows carried over: {summary['carried']}, rows without a source: {summary['unsourced']}")


@app.command()
def demo(workspace: Path = typer.Option(Path("ws/demo"), "--workspace", help="Where the demo writes."),
         profile: str = typer.Option("quick", help="quick (about 20 min on 2 cores) or full."),
         engine: str = ENGINE):
    """The end-to-end job on the embedded default target (SmolLM2-135M-Instruct)."""
    from specdraft.data.vllm_engine import engine_options
    from specdraft.pipeline import run_demo

    run_demo(workspace, recipe=profile, engine=engine_options(engine).name)


@app.command()
def recipe(model: str = typer.Argument(..., help="smollm2 (the embedded default), a hub id, a folder or a .gguf."),
           profile: Optional[str] = typer.Option(None, help="quick (the default) or full: the recipe files "
                                                 "shipped in src/specdraft/recipes/ (see docs/recipes.md)."),
           config: Optional[Path] = typer.Option(None, "--config", help="Your own recipe file instead of --profile "
                                                 "(copy src/specdraft/recipes/quick.yaml)."),
           workspace: Optional[Path] = typer.Option(None, "--workspace", help="Default: ws/<model>-<recipe name>."),
           conversations: Optional[str] = typer.Option(None, "--conversations", help="Conversations to regenerate "
                                                       "(file, hub dataset, builtin, self:N; default builtin)."),
           engine: str = ENGINE,
           data: Optional[str] = old_name("--data"),
           ):
    """Every stage, prepare to report, for any target: the recipe behind `make demo`."""
    from specdraft.data.vllm_engine import engine_options
    from specdraft.pipeline import run_recipe

    data = renamed(conversations, data, "--data", "--conversations") or "builtin"
    if profile and config:
        raise SpecdraftError("--profile and --config: pick one (a shipped recipe's name, or your recipe file)")
    chosen = config or profile or "quick"
    target = "default" if model in ("smollm2", "default") else model
    name = config.stem if config else chosen
    ws = workspace or Path("ws") / f"{model.replace('/', '--')}-{name}"
    run_recipe(target, ws, recipe=chosen, data=data, engine=engine_options(engine).name)


@app.command("export")
def export_cmd(
    run_or_ckpt: Path = typer.Argument(..., help="Checkpoint folder, or a run folder WS/runs/NAME (best/, else newest epoch)."),
    fmt: str = typer.Option("speculators", "--format", help="speculators (vLLM) or sglang."),
    out: Path = typer.Option(..., "--out", help="Output folder for the exported drafter."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="Weights dtype: bfloat16 (what vLLM/SGLang serve), float16 or float32."),
    no_embeddings: bool = typer.Option(False, "--no-embeddings", help="Drop embed_tokens (engines then use the "
                                       "target's); refused unless they equal the target's (--model)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="The target, to check --no-embeddings against "
                                        "(Hub id, local folder, .gguf, or 'default')."),
    num_speculative_tokens: Optional[int] = typer.Option(None, NUM_SPEC, "-k", help="Default draft length written "
                                                         "into the speculators config (default 3, or the most a DFlash drafter was trained for)."),
    as_json: bool = AS_JSON,
    speculative_tokens: Optional[int] = old_name("--speculative-tokens"),
):
    """Write the drafter in the layout a serving engine loads (see docs/serving.md)."""
    from specdraft.formats.checkpoints import export
    from specdraft.io import own_folder

    speculative_tokens = renamed(num_speculative_tokens, speculative_tokens, "--speculative-tokens", NUM_SPEC)
    if speculative_tokens is not None and speculative_tokens < 1:
        raise SpecdraftError(f"{NUM_SPEC} {speculative_tokens}: must be >= 1 (vLLM's "
                             "num_speculative_tokens; 3-5 is usual)")
    with own_folder(out, "export"):
        summary = export(run_or_ckpt, out, fmt, speculative_tokens=speculative_tokens, dtype=dtype,
                         embeddings=not no_embeddings, model=model)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        shared = "" if summary["has_embed_tokens"] else ", no embeddings: engines use the target's"
        console.print(f"[green]exported[/] {summary['source']} ({summary['source_layout']}) -> {out} ({fmt}, "
                      f"{summary['dtype']}, {summary['weight_bytes'] / 1e6:.1f} MB{shared}; model card README.md)")


@app.command("import")
def import_cmd(
    src: Path = typer.Argument(..., help="Drafter folder: speculators, SGLang, or official EAGLE-3 layout."),
    out: Path = typer.Option(..., "--out", help="Output folder (our layout)."),
    as_json: bool = AS_JSON,
):
    """Read a drafter in any supported layout and write it in ours."""
    from specdraft.formats.checkpoints import import_checkpoint
    from specdraft.io import own_folder

    with own_folder(out, "import"):
        summary = import_checkpoint(src, out)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    console.print(f"[green]imported[/] {src} ({summary['source_layout']}) -> {out}")
    if not summary["has_embed_tokens"]:
        console.print("note: no embed_tokens in the source; they are the target's (copy them before training)")
    if not summary["aux_layer_ids"]:
        console.print("note: the source names no aux layer ids; engines use their default [2, L//2, L-3]")


# ----------------------------------------------------------------------------- analysis: journal, compare, probe, plan, report

journal_app = typer.Typer(no_args_is_help=True, help="Decision journal beside a run (RUN/journal.md).")
app.add_typer(journal_app, name="journal")


def parse_floats(text: Optional[str], option: str) -> Optional[list[float]]:
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecdraftError(f"{option} {text!r}: expected comma-separated numbers such as 0.8,0.6,0.5") from None


@journal_app.command("add")
def journal_add(run: Path = typer.Argument(..., help="Run folder, e.g. WS/runs/NAME."),
                text: str = typer.Argument(..., help="What was hypothesised, found or decided."),
                kind: str = typer.Option(..., "--kind", help="hypothesis, result, decision, warning or probe.")):
    """Append a timestamped entry to RUN/journal.md."""
    from specdraft import journal

    entry = journal.add(run, kind, text)
    console.print(f"[green]journal[/] {entry.time} {entry.kind} -> {journal.journal_path(run)}")


@app.command("compare")
def compare_cmd(runs: List[Path] = typer.Argument(..., help="Run folders (or their metrics.jsonl)."),
                out: Optional[Path] = typer.Option(None, "--out", help="Folder for compare.md and curves.png."),
                metric: Optional[List[str]] = typer.Option(None, "--metric", help="Table metrics (repeatable)."),
                baseline: Optional[Path] = typer.Option(None, "--baseline", help="Flag runs that stay behind this run."),
                margin: float = typer.Option(0.05, help="Behind-baseline margin on full_acc_0 (absolute)."),
                as_json: bool = AS_JSON):
    """Validation metrics per epoch side by side, and curves aligned by tokens seen."""
    from specdraft.analysis import compare

    result = compare.compare(runs, out, tuple(metric) if metric else compare.DEFAULT_TABLE_METRICS,
                             baseline=baseline, margin=margin)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    compare.print_result(result)


@app.command("probe")
def probe_cmd(vocab: Optional[List[Path]] = typer.Option(None, "--vocab", help="Two mappings A and B (vocab file or drafter folder)."),
              model: Optional[List[str]] = typer.Option(None, "--model", "-m", help="Targets: two (A, B) for the hidden-state probe, one for --drafter."),
              prepared: Optional[Path] = typer.Option(None, "--prepared", help="Prepared data (WS/data) both targets read."),
              drafter: Optional[Path] = typer.Option(None, "--drafter", help="Drafter folder for the direct acceptance probe."),
              samples: int = typer.Option(32, help="Samples of --prepared to run."),
              max_tokens: int = typer.Option(512, help="Tokens per sample at most."),
              steps: int = typer.Option(5, help="Draft steps for the direct probe."),
              run: Optional[Path] = typer.Option(None, "--run", help="Run folder: write RUN/probe-*.json and a journal entry."),
              out: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here."),
              as_json: bool = AS_JSON,
              trust_remote_code: bool = TRUST,
              data: Optional[Path] = old_name("--data")):
    """Before fine-tuning: mapping overlap, hidden-state similarity of two targets, the drafter as it is."""
    from specdraft.analysis import probe

    data = renamed(prepared, data, "--data", "--prepared")
    if out is not None:
        from specdraft.io import check_output_file

        check_output_file(out, [*(vocab or []), data, drafter], ".json")
    results = probe.run(vocabs=vocab or [], models=model or [], data=data, drafter=drafter, samples=samples,
                        max_tokens=max_tokens, steps=steps, run=run, out=out,
                        trust_remote_code=trust_remote_code)
    for r in results:
        print(json.dumps(r, indent=2) if as_json else probe.format_result(r))


@app.command("plan")
def plan_cmd(drafter: Optional[Path] = typer.Option(None, "--drafter", help="Drafter folder (to time a draft step)."),
             model: str = MODEL,
             accept: Optional[str] = typer.Option(None, "--accept", help="eval/bench JSON, metrics.jsonl, or rates 0.8,0.6,..."),
             store: Optional[Path] = typer.Option(None, "--store", help="Hidden-state store (WS/hidden) to measure acceptance on."),
             verify_ms: Optional[str] = typer.Option(None, "--verify-ms", help="Verify latency for 1..K+1 tokens (ms), or one value for all."),
             draft_ms: Optional[float] = typer.Option(None, "--draft-ms", help="Drafter step latency (ms)."),
             num_speculative_tokens: Optional[int] = typer.Option(None, NUM_SPEC, "-k", help="Longest draft chain "
                                                                  "considered (default 8)."),
             context: int = typer.Option(512, help="KV cache length for the verify measurement."),
             rounds: int = typer.Option(3, "--rounds", help="Timing rounds: each times every verify length and the "
                                        "draft step, in an order rotated per round; the plan ranks the medians."),
             run: Optional[Path] = typer.Option(None, "--run", help="Run folder: write RUN/plan.json and a journal entry."),
             out: Optional[Path] = typer.Option(None, "--out", help="Write the plan JSON here."),
             as_json: bool = AS_JSON,
             trust_remote_code: bool = TRUST,
             data: Optional[Path] = old_name("--data"),
             k_max: Optional[int] = old_name("--k-max")):
    """Choose the number of draft tokens from acceptance per position and draft/verify cost."""
    from specdraft.analysis import plan

    data = renamed(store, data, "--data", "--store")
    k_max = renamed(num_speculative_tokens, k_max, "--k-max", NUM_SPEC)
    k_max = 8 if k_max is None else k_max
    if out is not None:
        from specdraft.io import check_output_file

        check_output_file(out, [accept, drafter, data], ".json")
    result = plan.run(drafter=drafter, model=model, accept=accept, data=data,
                      verify_ms=parse_floats(verify_ms, "--verify-ms"), draft_ms=draft_ms, k_max=k_max,
                      context=context, run=run, out=out, trust_remote_code=trust_remote_code, rounds=rounds)
    for warning in result.get("warnings", []):
        console.print(warning, highlight=False, soft_wrap=True)
    print(json.dumps(result, indent=2) if as_json else plan.format_plan(result))


@app.command("doctor")
def doctor_cmd(run: Path = typer.Argument(..., help="Run folder (specdraft train --out)."),
               model: Optional[str] = typer.Option(None, "--model", "-m", help="The target (default: the run's "
                                                   "config.yaml model)."),
               store: Optional[Path] = typer.Option(None, "--store", help="Hidden-state store (default: the run's)."),
               prompts: Optional[str] = typer.Option(None, "--prompts", help="jsonl of the prompts you serve (or "
                                                     "builtin-holdout): τ on them against τ on the store."),
               as_json: bool = AS_JSON):
    """Why is the acceptance low? Measured causes, ranked by the τ they cost, each with its evidence
    and the fix as a command; RUN/doctor.json keeps the result."""
    from specdraft.analysis import doctor

    result = doctor.diagnose(run, model=model, store=store, prompts=prompts)
    print(json.dumps(result, indent=2) if as_json else doctor.format_result(result))


@app.command("report")
def report_cmd(runs: List[Path] = typer.Argument(..., help="Run folders."),
               out: Optional[Path] = typer.Option(None, "--out", help="The HTML file (default: "
                                                  "report.html in the first run folder).")):
    """One self-contained HTML page that leads with τ, speedup and losslessness; then bench/eval
    tables, the export's serve commands, stage timings, curves, journal and config."""
    from specdraft.analysis import report

    if out is not None:
        from specdraft.io import check_output_file

        check_output_file(out, runs, ".html")
    path = report.build(runs, out)
    console.print(f"[green]report[/] -> {path}")


# Its options are generated from RunConfig (train/config.py); `python -m specdraft.train` (torchrun) runs the same.
app.command("train")(train_command)


@app.command()
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="User message (the chat template is applied)."),
    model: str = MODEL,
    drafter: Optional[str] = typer.Option(None, "--drafter", help="Drafter checkpoint or run folder; 'untrained[:N]' = random (timing only)."),
    method: str = typer.Option("eagle3", "--method", help="greedy (no drafting), ngram, or the drafter's family "
                               "(eagle3, peagle, ...: `specdraft info` lists them)."),
    num_speculative_tokens: Optional[str] = typer.Option(None, NUM_SPEC, "-k", help="Draft tokens per round, "
                                                         "or auto (the default for the eagle3 chain): chosen from "
                                                         "measured verify/draft costs and the drafter's acceptance; "
                                                         "K=0 (plain decoding) where no chain pays. --tree: 4."),
    draft_stop: Optional[str] = typer.Option(None, "--draft-stop", help=DRAFT_STOP_HELP),
    tree: Optional[str] = typer.Option(None, "--tree", help="EAGLE-2 tree depth,topk,total, e.g. 4,4,16 (greedy only)."),
    temperature: float = typer.Option(0.0, help="0 = greedy; >0 samples (rejection sampling keeps the target's distribution)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass."),
    seed: int = typer.Option(0, help="Sampling seed."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    ngram_max: int = typer.Option(3, "--ngram-max", help="Longest suffix n-gram looked up (ngram)."),
    ngram_min: int = typer.Option(1, "--ngram-min", help="Shortest suffix n-gram looked up (ngram)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    dtype: str = typer.Option("float32", help="Target/drafter dtype: float32, bfloat16 or float16."),
    as_json: bool = typer.Option(False, "--json", help="Print {text, token_ids, tokens_per_s, accept_len, new_tokens}."),
    trust_remote_code: bool = TRUST,
    k: Optional[str] = old_name("--k"),
):
    """Speculative generation for one prompt: streams the answer, then tokens/s and acceptance length."""
    from specdraft.infer import bench as B
    from specdraft.infer.tree import TreeShape
    from specdraft.infer.sampling import Sampling
    from specdraft.infer.speculative import eos_ids_of
    from specdraft.targets import DTYPES, load_target

    chain = B.needs_drafter(method) and not tree                   # a drafter's chain: -k auto applies
    k = parse_k(renamed(num_speculative_tokens, k, "--k", NUM_SPEC), default_auto=chain)
    stop = parse_draft_stop(draft_stop)
    choices = ["greedy", "ngram", *(n for n in B.all_methods() if B.needs_drafter(n) and not n.endswith(B.TREE))]
    if method not in choices:
        raise SpecdraftError(f"--method {method}: unknown; choose {', '.join(choices)}")
    if (k is None or stop is not None) and not chain:
        raise SpecdraftError(f"{NUM_SPEC} auto and --draft-stop: only with a drafter's chain (--method eagle3, "
                             "peagle, dflash, ...; no --tree)")
    if max_new_tokens < 1:
        raise SpecdraftError(f"--max-new-tokens {max_new_tokens}: must be >= 1")
    if dtype not in DTYPES:
        raise SpecdraftError(f"--dtype {dtype}: choose float32, bfloat16 or float16")
    shape = TreeShape.parse(tree) if tree else None
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
    if shape is not None and (method != "eagle3" or not sampling.greedy):
        raise SpecdraftError("--tree: only with --method eagle3 and greedy decoding (--temperature 0)")
    name = method + B.TREE if shape else method
    if drafter is None:
        B.check_drafter_methods([name], None)
    dev = B.resolve_device(device)
    target = load_target(model, dtype=dtype, device=dev, trust_remote_code=trust_remote_code)
    draft_model = B.load_drafter_for(drafter, target, dev, DTYPES[dtype]) if B.needs_drafter(method) else None
    B.check_drafter_methods([name], draft_model)
    tok = target.tokenizer
    ids = B.prompt_ids(tok, [{"role": "user", "content": prompt}])
    k, stop, _ = auto_settings(target, draft_model, drafter, ids, k, stop)
    m = B.build_methods([name], draft_model, k, shape, ngram_max, ngram_min, stop)[0]
    shown = {"ids": [], "text": ""}

    def stream(new):
        shown["ids"].extend(new)
        text = tok.decode(shown["ids"], skip_special_tokens=True)
        sys.stdout.write(text[len(shown["text"]):])
        sys.stdout.flush()
        shown["text"] = text

    from specdraft.infer.speculative import generate as spec_generate

    eos = eos_ids_of(target.model, tok)
    result = spec_generate(target.model, ids, m.proposer, max_new_tokens, sampling, eos,
                           None if as_json else stream, sync_cuda=dev.startswith("cuda"))
    text = tok.decode(result.token_ids, skip_special_tokens=True)
    if as_json:
        print(json.dumps({"text": text, "token_ids": result.token_ids, "tokens_per_s": result.tokens_per_s,
                          "accept_len": result.accept_len, "new_tokens": len(result.token_ids)}))
    else:
        sys.stdout.write("\n")
        console.print(f"{len(result.token_ids)} tokens, {result.tokens_per_s:.1f} tokens/s, "
                      f"mean acceptance length {result.accept_len:.2f} ({m.name})", highlight=False)


@app.command(context_settings={"allow_extra_args": True})
def bench(
    ctx: typer.Context,
    model: str = MODEL,
    drafter: Optional[str] = typer.Option(None, "--drafter", help="Drafter checkpoint or run folder; 'untrained[:N]' = random (timing only)."),
    prompts: str = typer.Option("builtin-holdout", "--prompts", help="jsonl with `messages` (user turns = prompt), or builtin-holdout."),
    methods: str = typer.Option("greedy,plain,ngram,eagle3", "--methods", help="Comma list of greedy "
                                 "(transformers generate), plain (specdraft's loop with no drafter: the speedup "
                                 "of its kernel paths alone), ngram, eagle3, eagle3-tree."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens"),
    num_speculative_tokens: Optional[str] = typer.Option(None, NUM_SPEC, "-k", help="Draft tokens per round, "
                                                         "or auto (the default with eagle3 in --methods): the eagle3 "
                                                         "chain's K chosen from measured costs and acceptance, K=0 "
                                                         "(plain decoding) where no chain pays; n-gram keeps 4."),
    draft_stop: Optional[str] = typer.Option(None, "--draft-stop", help=DRAFT_STOP_HELP),
    rounds: int = typer.Option(3, "--rounds", help="Rounds: each runs every method on every prompt, the method "
                               "order rotated per round; tok/s is the median over rounds, speedup the ratio of "
                               "medians."),
    tree: Optional[str] = typer.Option(None, "--tree", help="Tree for eagle3-tree: depth,topk,total (default 4,4,16)."),
    ngram_max: int = typer.Option(3, "--ngram-max"),
    ngram_min: int = typer.Option(1, "--ngram-min"),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use the first N prompts (builtin-holdout default 32)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the results JSON here (and a .png bar chart beside it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results JSON to stdout instead of the table."),
    profile: bool = typer.Option(False, "--profile", help="Print the draft / verify / other time split."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    trust_remote_code: bool = TRUST,
    k: Optional[str] = old_name("--k"),
):
    """Wall-clock speed of greedy (transformers generate), plain (specdraft's loop, no drafter), n-gram
    and EAGLE-3 on the same prompts, in interleaved rounds (median and spread per method)."""
    from specdraft.infer import bench as B
    from specdraft.infer.tree import TreeShape
    from specdraft.io import write_json
    from specdraft.progress import progress as progress_of
    from specdraft.targets import DTYPES, load_target

    as_json, out = json_or_out(ctx, as_json, out)
    if out is not None:   # the results JSON and the chart beside it
        from specdraft.io import check_output_file

        check_output_file(out, [prompts, drafter], ".json")
        check_output_file(out.with_suffix(".png"), [prompts, drafter], ".png")
    names = [n.strip() for n in methods.split(",") if n.strip()]
    chains = [n for n in names if B.needs_drafter(n) and not n.endswith(B.TREE)]   # -k auto applies to these
    k = parse_k(renamed(num_speculative_tokens, k, "--k", NUM_SPEC), default_auto=bool(chains))
    stop = parse_draft_stop(draft_stop)
    bad = [n for n in names if n not in B.all_methods()]
    if bad or not names:
        raise SpecdraftError(f"--methods {methods}: unknown {bad or 'empty'}; choose from {', '.join(B.all_methods())}")
    if max_new_tokens < 1 or rounds < 1:
        raise SpecdraftError(f"--max-new-tokens {max_new_tokens} --rounds {rounds}: each must be >= 1")
    if dtype not in DTYPES:
        raise SpecdraftError(f"--dtype {dtype}: choose float32, bfloat16 or float16")
    if (k is None or stop is not None) and not chains:
        raise SpecdraftError(f"{NUM_SPEC} auto and --draft-stop: for a drafter's chain; add its family (eagle3, "
                             "peagle, dflash, ...) to --methods")
    shape = TreeShape.parse(tree or B.DEFAULT_TREE)
    if drafter is None:
        B.check_drafter_methods(names, None)
    conversations = B.read_prompts(prompts, limit)
    dev = B.resolve_device(device)
    target = load_target(model, dtype=dtype, device=dev, trust_remote_code=trust_remote_code)
    draft_model = (B.load_drafter_for(drafter, target, dev, DTYPES[dtype])
                   if any(B.needs_drafter(n) for n in names) else None)
    B.check_drafter_methods(names, draft_model)          # --methods peagle for a P-EAGLE drafter
    ids = B.prompt_ids(target.tokenizer, conversations[0])
    k, stop, choice = auto_settings(target, draft_model, drafter, ids, k, stop)
    total = len(conversations) * len(set(names) | {"greedy"}) * rounds
    with progress_of("bench", total, 0, "runs", console=console) as tracker:
        report = B.bench(target, draft_model, conversations, names, max_new_tokens, k, shape, ngram_max, ngram_min,
                         progress=lambda name: tracker.advance(1, method=name), rounds=rounds, draft_stop=stop,
                         ngram_k=4 if choice and choice.k_auto else None)
    report["config"] = {"model": target.name, "drafter": drafter, "prompts": prompts,
                        "num_prompts": len(conversations), "max_new_tokens": max_new_tokens, "k": k,
                        "k_auto": choice.to_dict() if choice else None, "k_auto_line": choice.line() if choice else None,
                        "draft_stop": stop, "rounds": rounds,
                        "tree": [shape.depth, shape.topk, shape.total] if "eagle3-tree" in names else None,
                        "ngram": [ngram_min, ngram_max], **B.environment(dev, dtype)}
    for warning in report["warnings"]:
        console.print(warning, highlight=False, soft_wrap=True)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        Console().print(bench_table(report, f"bench: {target.name}, {len(conversations)} prompts x {max_new_tokens} "
                                    f"tokens, median of {rounds} interleaved rounds (min-max)"))
    if profile:
        for name, r in report["methods"].items():
            p = r.get("profile")
            if p:
                console.print(f"{name:12s} draft {p['draft_frac']:6.1%}  verify {p['verify_frac']:6.1%}  "
                              f"other {p['other_frac']:6.1%}  ({p['total_s']:.2f} s)", highlight=False)
    if out is not None:
        write_json(out, report)
        B.plot(report, out.with_suffix(".png"))
        console.print(f"[green]bench[/] -> {out}, {out.with_suffix('.png')}")



def parse_k(text: Optional[str], default_auto: bool = False) -> Optional[int]:
    """-k: a whole number >= 1, or auto (None: chosen by the cost model). Unset: auto for the EAGLE-3
    chain (`default_auto`), 4 for the n-gram proposer and the tree."""
    if text is None:
        return None if default_auto else 4
    if text.strip().lower() == "auto":
        return None
    try:
        k = int(text)
    except ValueError:
        raise SpecdraftError(f"{NUM_SPEC} {text}: expected a whole number >= 1 or auto") from None
    if not 1 <= k <= K_MAX:
        raise SpecdraftError(f"{NUM_SPEC} {k}: must be 1..{K_MAX} (or auto)")
    return k


def parse_draft_stop(text: Optional[str]):
    """--draft-stop: None (off), a probability in [0, 1], or "auto"."""
    if text is None or text.strip().lower() == "auto":
        return None if text is None else "auto"
    try:
        p = float(text)
    except ValueError:
        raise SpecdraftError(f"--draft-stop {text}: expected a probability in [0, 1] or auto") from None
    if not 0.0 <= p <= 1.0:
        raise SpecdraftError(f"--draft-stop {text}: must lie in [0, 1] (a probability), or auto")
    return p


def auto_settings(target, draft_model, drafter: Optional[str], ids: list[int], k: Optional[int], stop):
    """Resolve -k auto / --draft-stop auto with the cost model (one line on stderr with the choice and
    its prediction). -> (k, stop threshold or None, the AutoChoice or None)."""
    if k is not None and stop != "auto":
        return k, stop, None
    from specdraft.infer import auto

    choice = auto.choose(target.model, draft_model, drafter, ids, k, None if stop == "auto" else stop,
                         stop_auto=stop == "auto")
    console.print(choice.line(), highlight=False, soft_wrap=True)
    return choice.k, choice.stop, choice


def bench_table(report: dict, title: str):
    """bench's human table: median tok/s and speedup with their min-max over the rounds."""
    from rich.table import Table

    table = Table(title=title)
    cut = any(r.get("drafts_cut") for r in report["methods"].values())
    over_plain = "plain" in report["methods"]
    for col in ("method", "tokens/s", "speedup") + (("x plain",) if over_plain else ()) + (
            "accept len", "per-position accept", "= greedy") + (("drafts cut",) if cut else ()):
        table.add_column(col)
    n = report["config"]["num_prompts"]
    for name, r in report["methods"].items():
        pos = " ".join(f"{a:.2f}" for a in r["per_position_accept"]) or "-"
        tps, up = r.get("tokens_per_s_spread"), r.get("speedup_spread")
        row = [name, f"{r['tokens_per_s']:.1f}" + (f" ({tps['min']:.1f}-{tps['max']:.1f})" if tps else ""),
               f"{r['speedup']:.2f}x" + (f" ({up['min']:.2f}-{up['max']:.2f})" if up and name != "greedy" else ""),
               *((f"{r['speedup_over_plain']:.2f}x",) if over_plain else ()),
               f"{r['accept_len']:.2f}", pos,
               "yes" if r["identical_to_greedy"] else f"no ({r['prompts_identical']}/{n})"]
        table.add_row(*row, *((str(r.get("drafts_cut", 0)),) if cut else ()))
    return table


@app.command("eval", context_settings={"allow_extra_args": True})
def eval_cmd(
    ctx: typer.Context,
    drafter: str = typer.Option(..., "--drafter", help="Drafter checkpoint or run folder."),
    store: Optional[Path] = typer.Option(None, "--store", help="Hidden-state store (WS/hidden)."),
    model: str = MODEL,
    split: str = typer.Option("val", help="val (the run's held-out samples) or all."),
    steps: int = typer.Option(5, help="Draft positions to measure (1..7)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the results JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the results JSON to stdout instead of the summary."),
    trust_remote_code: bool = TRUST,
    data: Optional[Path] = old_name("--data"),
):
    """Acceptance from stored hidden states: per-position rates and simulated acceptance length."""
    from specdraft.analysis.evaluate import evaluate
    from specdraft.io import write_json

    as_json, out = json_or_out(ctx, as_json, out)
    data = required(renamed(store, data, "--data", "--store"), "--store", "the hidden-state store (WS/hidden)")
    if out is not None:
        from specdraft.io import check_output_file

        check_output_file(out, [drafter, data], ".json")
    result = evaluate(drafter, data, model=model, split=split, steps=steps, trust_remote_code=trust_remote_code)
    rates = " ".join(f"{a:.3f}" for a in result["cond_acc"])
    by_k = " ".join(f"K={k}:{a:.2f}" for k, a in enumerate(result["accept_len_by_k"]) if k)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print(f"split        {result['split']}\ncond_acc     {rates}\naccept_len   {result['accept_len']:.3f}\n"
              f"by chain K   {by_k}")
    if out is not None:
        write_json(out, result)
        console.print(f"[green]eval[/] -> {out}")


def json_or_out(ctx: typer.Context, as_json: bool, out: Optional[Path]) -> tuple[bool, Optional[Path]]:
    """eval and bench once took `--json PATH` for the file they write; now --json prints to stdout
    and --out PATH writes. The old form (--json followed by a path) still writes PATH, with a note,
    for one release."""
    extra = list(ctx.args)
    if extra and as_json and out is None and len(extra) == 1:
        print(f"note: --json PATH is deprecated, use --out {extra[0]} (--json now prints JSON to stdout)",
              file=sys.stderr)
        from specdraft.io import check_file_target

        return False, check_file_target(extra[0])
    if extra:
        raise SpecdraftError(f"unexpected argument {' '.join(extra)!r} (write a file with --out PATH; --json "
                             "prints JSON to stdout)")
    if out is not None:
        from specdraft.io import check_file_target

        check_file_target(out)   # before minutes of work, not after
    return as_json, out


for _group in (app, vocab_app, journal_app, store_app):
    for _command in _group.registered_commands:
        _command.callback = numbers_checked_first(_command.callback)


def main() -> None:
    """Entry point: bad input becomes one line on stderr and exit code 2, never a traceback.

    OS errors that no writer turned into a message (a full disk, a path that is a folder, no
    permission) are bad input too: one line naming the path. SPECDRAFT_DEBUG=1 shows the traceback."""
    import os

    from specdraft.io import os_error_line

    try:
        app()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        sys.exit(130)
    except Exception as e:
        line = str(e) if isinstance(e, SpecdraftError) else os_error_line(getattr(e, "filename", None), e)
        if line is None:
            raise   # a bug, not bad input: the traceback is what helps
        if os.environ.get("SPECDRAFT_DEBUG") == "1":
            console.print_exception()
        console.print(f"[red]error:[/] {line}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
