"""The `specdraft` command: one sub-command per stage. No logic here: parse, call, print."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from specdraft.errors import SpecdraftError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train, adapt, evaluate and ship EAGLE-3 drafters.")
vocab_app = typer.Typer(no_args_is_help=True, help="Draft vocabulary: build, diff, remap.")
app.add_typer(vocab_app, name="vocab")
console = Console(stderr=True)

MODEL = typer.Option("default", "--model", "-m", help="Hub id, local folder, .gguf file, or 'default' (SmolLM2-135M-Instruct).")
TRUST = typer.Option(False, "--trust-remote-code", help="Allow the model's own Python code (only for models you trust).")


def parse_layers(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecdraftError(f"--layers {text!r}: expected comma-separated integers such as 2,15,27") from None


@app.command()
def info(model: str = MODEL, trust_remote_code: bool = TRUST,
         as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Architecture, layers, hidden size, vocab, tied lm_head, chat template, default aux layers."""
    from specdraft.targets import info as target_info

    data = target_info(model, trust_remote_code)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    for k, v in data.items():
        print(f"{k:20s} {v}")


@app.command()
def prepare(
    data: str = typer.Option(..., "--data", help="jsonl/json/parquet file, a Hugging Face dataset id, or 'builtin'."),
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
):
    """Render conversations with the chat template and build the assistant-token loss mask."""
    from specdraft.data.prepare import prepare as run_prepare

    summary = run_prepare(model=model, source=data, out=out, regenerate=regenerate, temperature=temperature,
                          max_new_tokens=max_new_tokens, max_length=max_length,
                          min_assistant_tokens=min_assistant_tokens, dedup=dedup, limit=limit,
                          batch_size=batch_size, split=split, seed=seed, trust_remote_code=trust_remote_code)
    console.print(f"[green]prepared[/] {summary['counts']['samples']} samples, "
                  f"{summary['counts']['tokens']} tokens ({summary['counts']['loss_tokens']} trained) -> {out}")


@app.command()
def capture(
    data: Optional[Path] = typer.Option(None, "--data", help="Prepared data folder (WS/data)."),
    out: Path = typer.Option(..., "--out", help="Store folder (WS/hidden)."),
    model: str = MODEL,
    layers: Optional[str] = typer.Option(None, help="Aux layer ids, e.g. 2,15,27 (default [2, L//2, L-3])."),
    dtype: str = typer.Option("bfloat16", help="Stored dtype: bfloat16, float16 or float32."),
    batch_tokens: int = typer.Option(4096, help="Tokens per forward (length-bucketed batches)."),
    shard_tokens: int = typer.Option(65536, help="Tokens per shard file."),
    resume: bool = typer.Option(False, "--resume", help="Continue at the first missing shard."),
    verify: bool = typer.Option(False, "--verify", help="Only re-hash the shards of --out and report."),
    trust_remote_code: bool = TRUST,
):
    """Store the target's aux hidden states and pre-norm last layer output, per token."""
    from specdraft.data import capture as cap

    if verify:
        report = cap.verify_store(out)
        console.print(f"[green]ok[/] {report['shards']} shards, {report['samples']} samples, "
                      f"{report['tokens']} tokens verified in {out}")
        return
    if data is None:
        raise SpecdraftError("capture: --data WS/data is required (or pass --verify)")
    manifest = cap.capture(model=model, data=data, out=out, layers=parse_layers(layers), dtype=dtype,
                           batch_tokens=batch_tokens, shard_tokens=shard_tokens, resume=resume,
                           trust_remote_code=trust_remote_code)
    console.print(f"[green]captured[/] {manifest['num_samples']} samples, {manifest['num_tokens']} tokens "
                  f"in {len(manifest['shards'])} shards -> {out}")


@vocab_app.command("build")
def vocab_build(
    data: Path = typer.Option(..., "--data", help="Prepared data folder (WS/data) or a hidden store."),
    size: int = typer.Option(..., "--size", help="Draft vocabulary size N."),
    out: Path = typer.Option(..., "--out", help="Output file, e.g. WS/vocab.safetensors."),
    model: Optional[str] = typer.Option(None, "--model", help="Target (for its vocab size); default: the one named in the data."),
):
    """Top-N target tokens by frequency over loss-masked tokens, as d2t offsets / t2d mask."""
    from specdraft import vocab

    summary = vocab.build_from_data(data, size, out, model=model)
    console.print(f"[green]vocab[/] {summary['draft_vocab_size']} of {summary['target_vocab_size']} tokens, "
                  f"covers {summary['coverage']:.1%} of trained tokens -> {out}")


@vocab_app.command("diff")
def vocab_diff(a: Path = typer.Argument(..., help="Mapping A (.safetensors or drafter folder)."),
               b: Path = typer.Argument(..., help="Mapping B."),
               as_json: bool = typer.Option(False, "--json")):
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
                as_json: bool = typer.Option(False, "--json")):
    """Row permutation from A's draft ids to B's, and B's rows that have no source."""
    from specdraft import vocab

    r = vocab.remap(vocab.load(a), vocab.load(b))
    if out is not None:
        vocab.save_remap(r, out)
    summary = {"carried": int((r.src >= 0).sum()), "unsourced": int((r.src < 0).sum()),
               "draft_vocab_size": int(r.src.numel())}
    print(json.dumps(summary, indent=2) if as_json else
          f"rows carried over: {summary['carried']}, rows without a source: {summary['unsourced']}")


@app.command()
def demo(workspace: Path = typer.Option(Path("ws/demo"), "--workspace", help="Where the demo writes."),
         profile: str = typer.Option("quick", help="quick or full.")):
    """The end-to-end job on the embedded default target."""
    from specdraft.recipes import run_demo

    run_demo(workspace, profile=profile)


def main() -> None:
    """Entry point: bad input becomes one line on stderr and exit code 2, never a traceback."""
    try:
        app()
    except SpecdraftError as e:
        console.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        sys.exit(130)


if __name__ == "__main__":
    main()
