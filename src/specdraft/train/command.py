"""The train command, shared by `specdraft train` and `python -m specdraft.train` (what torchrun
runs): its settings options are generated from RunConfig's fields (flag, type, default, help), so
a setting is written once, in train/config.py. The launcher's own options (how to run, never saved
in config.yaml) are written here.

Kept light to import (the CLI imports it to build its help): torch and the loop load on use.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import typing
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.text import Text

from specdraft.errors import SpecdraftError
from specdraft.metrics import tau_text
from specdraft.train.config import RunConfig, choices, flag, resolve_config

# the same meanings as the other commands' (specdraft/flags.py; kept light: no import of it here)
ENGINE_MEANING = "What runs the target."     # bench's --engine: whose decoding loop (specdraft's or vLLM's)
ENGINE_HELP = (ENGINE_MEANING + " Here: over data, hf (transformers, in this process), vllm, or auto (vLLM when "
               "installed and a CUDA device is present).")
TP_HELP = "GPUs per vLLM engine (tensor parallelism)."
ENGINE_ARGS_HELP = """JSON object passed to vllm.LLM(...), e.g. '{"max_model_len": 4096}'."""
STORE_FORMAT_HELP = ("How a store keeps hidden states: bf16 (exact), fp8 (~0.5x) or compact (int4 aux + the "
                     "teacher's top-k, ~0.2x).")

SETTINGS_PANEL = "Settings (RunConfig: also in --config YAML, saved in RUN/config.yaml)"
LAUNCH_PANEL = "Launch (how to run; not saved)"


def train(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", help="A recipe file: YAML with training settings (and a "
                                          "recipe: section for `specdraft recipe`). Here: any setting below, e.g. "
                                          "src/specdraft/recipes/quick.yaml; flags override it."),
    nproc: int = typer.Option(1, "--nproc", rich_help_panel=LAUNCH_PANEL,
                              help="Processes: N > 1 re-launches under torchrun (gloo on CPU, NCCL on GPU; see --parallel)."),
    parallel: str = typer.Option("ddp", "--parallel", rich_help_panel=LAUNCH_PANEL,
                                 help="With --nproc N > 1: ddp, or fsdp (FSDP2 shards weights and optimizer state)."),
    online: bool = typer.Option(False, "--online", rich_help_panel=LAUNCH_PANEL,
                                help="Compute hidden states with --model inside the loop (no store)."),
    prepared: Optional[str] = typer.Option(None, "--prepared", rich_help_panel=LAUNCH_PANEL,
                                           help="Prepared data (WS/data, from `specdraft prepare`). Here: for --online."),
    engine: str = typer.Option("auto", "--engine", rich_help_panel=LAUNCH_PANEL, help=ENGINE_HELP + " With --online."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "-tp", rich_help_panel=LAUNCH_PANEL,
                                             help=TP_HELP + " Here: with --online --engine vllm."),
    engine_args: Optional[str] = typer.Option(None, "--engine-args", rich_help_panel=LAUNCH_PANEL,
                                              help=ENGINE_ARGS_HELP + " Here: with --online --engine vllm."),
    store_format: str = typer.Option("bf16", "--store-format", rich_help_panel=LAUNCH_PANEL,
                                     help=STORE_FORMAT_HELP + " Here: with --online, train on the hidden states as "
                                          "a store of this format would hold them."),
    **settings,
):
    """Train a drafter on a hidden-state store. Training-time test (TTT) unrolls the draft steps."""
    from specdraft.train import distributed

    if parallel not in distributed.STRATEGIES:
        raise SpecdraftError(f"--parallel {parallel}: use one of {', '.join(distributed.STRATEGIES)}")
    if nproc > 1 and not distributed.launched_by_torchrun():
        argv = sys.argv[2:] if ctx.parent else sys.argv[1:]     # after `specdraft train` / `-m specdraft.train`
        distributed.exec_torchrun(nproc, distributed.forward_cli_args(argv))
    if not online and store_format != "bf16":      # a misused flag first: it is wrong whatever else is given
        raise SpecdraftError(f"--store-format {store_format}: only with --online (a store's format is chosen at "
                             "capture: `specdraft capture --store-format`, or `specdraft store convert`)")
    overrides = {name: value for name, value in settings.items()
                 if getattr(ctx.get_parameter_source(name), "name", "") != "DEFAULT"}
    if isinstance(overrides.get("store"), list) and len(overrides["store"]) == 1:
        overrides["store"] = overrides["store"][0]   # one store stays a string in config.yaml
    if "resume" in overrides or "out" in overrides:   # resume reads RUN/config.yaml unless --config is given
        overrides.setdefault("out", settings["out"])
    cfg = resolve_config(config, **overrides)
    check_inputs_given(cfg, online)
    data = prepared
    setup = None
    if online:
        from specdraft.data.vllm_engine import engine_options
        from specdraft.train.online import online_setup

        setup = online_setup(data, engine_options(engine, tensor_parallel_size, engine_args), store_format)
    summary = run(cfg, parallel, setup)
    if summary is not None:
        val = summary.get("val") or {}
        tail = (f", val loss {val['loss']:.4f}, {tau_text(val['accept_len'], cfg.ttt_steps, 'held-out', digits=3)}"
                if val else "")
        done = ("stopped behind baseline after", "yellow") if summary.get("stopped") else ("trained", "green")
        Console(stderr=True).print(Text.assemble(done, f" {summary.get('steps', summary.get('stopped_at_step'))} steps, "
                                                 f"{summary['tokens_seen']:,} tokens{tail} -> {cfg.out}"))


def check_inputs_given(cfg: RunConfig, online: bool) -> None:
    """--out, --store and --vocab have no defaults: a forgotten --store once trained on whatever
    ws/hidden the current folder held, and the error named a path the user never typed."""
    needed = [("--out", cfg.out, "the run folder"), ("--vocab", cfg.vocab, "the draft vocab")]
    needed += [] if online else [("--store", cfg.store, "the hidden-state store")]
    missing = [f"{flag} ({what})" for flag, value, what in needed if not value or value == [""]]
    if missing:
        raise SpecdraftError(f"train: {', '.join(missing)} required: pass them as flags or in --config")


def run(cfg: RunConfig, parallel: str = "ddp", setup=None) -> dict | None:
    """Train `cfg` in this process, or as one rank when torchrun started several (then only the
    command's own summary line is skipped: rank 0 writes the run). `setup(cfg, runtime)` returns
    extra train() arguments (online mode)."""
    from specdraft.train import distributed
    from specdraft.train.runtime import Runtime
    from specdraft.train.loop import train as train_loop

    if distributed.launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
        distributed.run(cfg, strategy=parallel, setup=setup)
        return None
    return train_loop(cfg, **(setup(cfg, Runtime()) if setup else {}))


def setting_option(f: dataclasses.Field, hint) -> inspect.Parameter:
    """A RunConfig field as a typer option: --ttt-steps for ttt_steps, --x/--no-x for a switch,
    the choices of a Literal as its metavar."""
    names = [flag(f.name) + (f"/--no-{flag(f.name)[2:]}" if hint is bool else "")]
    names += [f.metadata["short"]] if f.metadata["short"] else []
    allowed = choices(hint)
    kind = str if allowed else hint
    default = f.default
    if hint == str | list[str]:          # --store A --store B: a list option (one value is saved as a string)
        kind, default = list[str], [f.default]
    option = typer.Option(default, *names, help=f.metadata["help"], rich_help_panel=SETTINGS_PANEL,
                          metavar="[" + "|".join(allowed) + "]" if allowed else "PATH" if kind == list[str] else None)
    return inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option, annotation=kind)


def _with_settings(func):
    """Give `func(..., **settings)` one keyword parameter per RunConfig field, which is what typer reads."""
    hints = typing.get_type_hints(RunConfig)
    own = [p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD]
    fields = [setting_option(f, hints[f.name]) for f in dataclasses.fields(RunConfig)]
    func.__signature__ = inspect.Signature([*own[:2], *fields, *own[2:]])   # ctx, --config, settings, launcher
    return func


_with_settings(train)
LAUNCHER = {name for name in inspect.signature(train).parameters if name != "ctx"} - {
    f.name for f in dataclasses.fields(RunConfig)}


def module_app() -> typer.Typer:
    """`python -m specdraft.train`: the train command alone."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command()(train)
    return app


def main(argv: list[str] | None = None) -> int:
    """`python -m specdraft.train ARGS`, errors as one line and exit 2."""
    try:
        module_app()(argv, prog_name="python -m specdraft.train")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except SpecdraftError as e:
        Console(stderr=True).print(Text.assemble(("error:", "red"), f" {e}"), highlight=False, soft_wrap=True)
        return 2
    return 0
