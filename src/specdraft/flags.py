"""The command line's vocabulary: one meaning per flag name in every command (issue 28).

A flag's help is its meaning, the same text in every command that has the flag, then optionally
" Here: " and what is particular to this command (tests/test_flags.py checks the meanings across
all sub-commands, train's generated options included).
Here too: the bounds every numeric option is checked against before any work, the parsers of
-k / --draft-stop / --layers, the plain help (80 columns, no Python types, pipeline order) and
"did you mean" for the flag names of neighbouring tools (SpecForge, speculators, vLLM)."""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import typing
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from specdraft.defaults import DRAFT_LENGTH, K_MAX, NUM_SPEC
from specdraft.errors import SpecdraftError
from specdraft.io import os_error_line
from specdraft.train.command import ENGINE_ARGS_HELP, ENGINE_HELP, ENGINE_MEANING, STORE_FORMAT_HELP, TP_HELP
from specdraft.train.config import MAX_TTT_STEPS, RunConfig

MODEL_HELP = "The target: hub id, local folder, .gguf file, or 'default' (SmolLM2-135M-Instruct)."


def draft_length_help(detail: str) -> str:
    return f"Draft tokens per round (vLLM's num_speculative_tokens; default {DRAFT_LENGTH}). {detail}".strip()


DRAFTER_HELP = "The drafter: a checkpoint or run folder."
STORE_HELP = "Hidden-state store (WS/hidden, from `specdraft capture`)."
PROMPTS_HELP = ("Prompts: a jsonl with `messages` (each line's turns up to its last user turn), builtin-holdout, "
                "or natural (96 hand-written, shipped).")
MAX_CONTEXT = typer.Option(None, "--max-context", help=(
    "With --prompts long: the longest prompt plus answer, in tokens (default: the target's context)."))
PREPARED_HELP = "Prepared data (WS/data, from `specdraft prepare`)."
VOCAB_HELP = "Draft vocab from `specdraft vocab build`."
TREE_HELP = "EAGLE-2 tree: depth,topk,total, e.g. 4,4,16."
PART_HELP = "I/N: one of N nodes' share (samples with index % N == I-1)."
CONFIG_HELP = "A recipe file: YAML with training settings (and a recipe: section for `specdraft recipe`)."
PROFILE_HELP = "A shipped recipe: quick or full."
WORKSPACE_HELP = "Where every stage writes."
BASELINE_HELP = "A run to beat: its folder or metrics.jsonl."
CONVERSATIONS_HELP = ("Conversations: jsonl/json/parquet file, a Hugging Face dataset id, 'builtin', 'self:N' "
                      "(the target writes N questions), 'pydoc' (Python's documentation as the answers, "
                      "used as written), 'long' (runs of standard-library source continued, as long as the maximum "
                      "length allows: long-context rows), or a mixture such as builtin:0.5,self:0.5 (the weights "
                      "share out the sample limit).")
OUT_HELP = "Where this command writes."

MODEL = typer.Option("default", "--model", "-m", help=MODEL_HELP)
TRUST = typer.Option(False, "--trust-remote-code", help="Allow the model's own Python code (only for models you trust).")
ENGINE = typer.Option("auto", "--engine", help=ENGINE_HELP)
TP = typer.Option(1, "--tensor-parallel-size", "-tp", help=TP_HELP)
ENGINE_ARGS = typer.Option(None, "--engine-args", help=ENGINE_ARGS_HELP)
AS_JSON = typer.Option(False, "--json", help="Print JSON to stdout instead of the summary.")
COMPUTE_DTYPE_HELP = "Dtype the target runs in: float32, bfloat16 or float16."
COMPUTE_DTYPE = typer.Option("float32", "--compute-dtype", help=COMPUTE_DTYPE_HELP + (
    " Here: or auto (bf16 where it measures faster, timed once per machine). float32 emits transformers' greedy "
    "tokens; any dtype emits plain decoding's tokens at the same R (a chain; a tree only in float32)."))
AUTO_DTYPE_HELP = (COMPUTE_DTYPE_HELP + " Here: or auto (bf16 on a GPU, and on a CPU where bf16 matmuls measure "
                   "faster, timed once per machine); {record} records it.")
REGEN_DTYPE = typer.Option("auto", "--compute-dtype", help=AUTO_DTYPE_HELP.format(record="prepare.json"))
REGEN_MAX_NEW_TOKENS = typer.Option(None, "--max-new-tokens", help=(
    "New tokens per answer at most. Here: per regenerated assistant turn; default 4096 for a target "
    "whose template thinks (its generation prompt leaves reasoning open), else 256."))
PREPARE_MAX_LENGTH = typer.Option(None, "--max-length", help=(
    "Drop samples longer than this many tokens; default 8192 for a target whose template thinks, else 2048."))
CHAT_TEMPLATE_KWARGS = typer.Option(None, "--chat-template-kwargs", help=(
    "Arguments of the chat template as a JSON object (vLLM's chat_template_kwargs), e.g. "
    "'{\"enable_thinking\": false}' (Qwen3), '{\"thinking\": false}' (Kimi), '{\"reasoning_effort\": \"low\"}' "
    "(gpt-oss); each must be one the template reads. Default: the template's own defaults."))
BUDGET_MINUTES = typer.Option(None, "--budget-minutes", help=(
    "Regenerate for about this many minutes: rounds of 2 x --batch-size conversations more, each the "
    "first of the same seeded order, up to --limit; no round starts that would end past the budget "
    "(prepare.json records the rounds)."))
CAPTURE_DTYPE = typer.Option("auto", "--compute-dtype", help=AUTO_DTYPE_HELP.format(record="the store's manifest.json"))
DEVICE = typer.Option("auto", "--device", help="Where the models run: auto, cpu or cuda.")
DRAFT_STOP = typer.Option(None, "--draft-stop", help=(
    "Confidence stop for the drafter's chain: end a draft when its confidence (the product of its top-1 "
    "probabilities) falls below P in [0, 1]; auto = where one more draft token costs more than it earns "
    "(cost model). Never changes the output."))
DRAFTER_OR_UNTRAINED = typer.Option(None, "--drafter", help=DRAFTER_HELP + " Here: 'untrained[:N]' = random (timing only).")
DRAFT_LENGTH_OR_AUTO = typer.Option(None, NUM_SPEC, "-k", help=draft_length_help(
    "Here: or auto, the default for a drafter's chain: K from measured costs and acceptance, K=0 (plain "
    "decoding) where no chain pays."))
CONTEXT_BUCKETS = typer.Option(None, "--context-buckets", help=(
    "Edges of the context-length buckets τ is also given for, in tokens (default 512,2048,4096,8192: "
    "<512, 512-2K, 2K-4K, 4K-8K)."))
RUN_RECORD = typer.Option(None, "--run", help="Run folder: the result and a journal entry go there.")


def check_run_record(run, before_training: bool = False) -> None:
    """--run of plan and probe (the result and a journal entry go there): an existing folder, never one a typo
    makes silently (it was created, written into, exit 0). probe runs before fine-tuning (`before_training`):
    its run may not exist yet, and a note says it is made."""
    if run is None or Path(run).is_dir():
        return
    if not before_training or not Path(run).parent.is_dir():
        raise SpecdraftError(f"--run {run}: no such run folder; pass the run (WS/runs/NAME) this result belongs to, "
                             "or drop --run")
    say(f"note: --run {run} did not exist: it is made, a new run folder for this result (a typo? then delete it)")


def out_option(here: str, required: bool = False):
    """--out: where this command writes, `here` saying what."""
    return typer.Option(... if required else None, "--out", help=f"{OUT_HELP} Here: {here}")


MAX_NEW_TOKENS_HELP = "New tokens per answer at most."
VERIFY_ROWS = typer.Option(None, "--verify-rows", help=(
    "Target rows of every decoding round: the root, the drafts, pad rows after them. Runs with the same R emit "
    "the same tokens with or without a drafting chain, in any dtype (bf16 too; a tree only in fp32). Default: with -k auto, the R "
    "measured cheapest for its K, for the chain and plain decoding; else 1 + the method's largest draft."))
COMPILE = typer.Option(False, "--compile", help=(
    "Verify rounds under torch.compile (the prompt's prefill stays eager): the first round of each row count "
    "compiles (seconds to a minute on a CPU), later rounds run faster, so it pays over many rounds in one "
    "process. Lossless as without it (fp32: transformers' greedy; a chain: plain decoding at its R). -k auto "
    "times the uncompiled forward."))
NGRAM_MAX = typer.Option(3, "--ngram-max", help="Longest suffix n-gram the ngram method looks up.")
NGRAM_MIN = typer.Option(1, "--ngram-min", help="Shortest suffix n-gram the ngram method looks up.")
DATASTORE = typer.Option(None, "--datastore", help="Prepared data (WS/data) whose answers, the target's own, ngram "
                         "and hybrid also draft from where the context repeats no 2 tokens.")
TEMPERATURE_HELP = "Sampling temperature (0 = greedy)."
SEED_HELP = "Seed of what this command draws at random."


# ----------------------------------------------------------------------------- numbers at their limits

COUNT_MAX = 2**31 - 1          # counts of tokens, samples, prompts: what an int32 index holds
SEED_MAX = 2**32 - 1           # torch.manual_seed and numpy take 64 bits; the loader mixes the seed further


def between(low, high):
    return (lambda v: low <= v <= high), f"must be {low}..{high}"


# The numeric options of every command (by parameter name) and the values they accept, checked
# before the command does anything. Train's settings are bounded in RunConfig (train/config.py).
NUMBER_BOUNDS = {
    "max_new_tokens": between(1, COUNT_MAX), "max_length": between(2, COUNT_MAX),
    "min_assistant_tokens": between(1, COUNT_MAX), "limit": between(1, COUNT_MAX),
    "batch_size": between(1, COUNT_MAX), "batch_tokens": between(1, COUNT_MAX),
    "shard_tokens": between(1, COUNT_MAX), "samples": between(1, COUNT_MAX),
    "tokens_per_sample": between(2, COUNT_MAX),
    "context": between(1, COUNT_MAX), "size": between(1, COUNT_MAX), "seed": between(0, SEED_MAX),
    "rounds": between(1, 10_000), "tensor_parallel_size": between(1, 1024), "nproc": between(1, 1024),
    "num_speculative_tokens": between(1, K_MAX), "max_k": between(1, K_MAX),
    "draft_length": between(1, MAX_TTT_STEPS), "ngram_max": between(1, 64), "ngram_min": between(1, 64),
    "temperature": ((lambda v: v >= 0), "must be >= 0 (0 = greedy)"), "follow_ups": between(0, 1),
    "top_p": ((lambda v: 0 < v <= 1), "must be in (0, 1]"),
    "margin": ((lambda v: v >= 0), "must be >= 0"),
    "draft_ms": ((lambda v: v > 0), "must be > 0"),
    "budget_minutes": ((lambda v: v > 0), "must be > 0 (minutes of regeneration)"),
    "verify_rows": between(1, 1024), "max_context": between(512, COUNT_MAX), "batch": between(1, COUNT_MAX),
}


def option_flag(name: str) -> str:
    return NUM_SPEC if name in ("num_speculative_tokens", "draft_length") else "--" + name.replace("_", "-")


def check_numbers(values: dict, skip=()) -> None:
    """Refuse a numeric option beyond its NUMBER_BOUNDS, or not finite, in one line naming it."""
    for name, value in values.items():
        if name in skip or name not in NUMBER_BOUNDS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue   # unset, or a text option parsed later (-k auto)
        ok, rule = NUMBER_BOUNDS[name]
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecdraftError(f"{option_flag(name)} {value}: must be a finite number")
        if not ok(value):
            raise SpecdraftError(f"{option_flag(name)} {value}: {rule}")


def numbers_checked_first(command, skip_settings: bool = False):
    """Wrap a command so that check_numbers runs on its options before its body."""
    settings = {f.name for f in dataclasses.fields(RunConfig)} if skip_settings else set()

    @functools.wraps(command)
    def checked(*args, **kwargs):
        check_numbers(kwargs, skip=settings)
        return command(*args, **kwargs)

    return checked


# ----------------------------------------------------------------------------- parsers

def parse_layers(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecdraftError(f"--layers {text!r}: expected comma-separated integers such as 2,15,27") from None


def parse_floats(text: Optional[str], option: str) -> Optional[list[float]]:
    if text is None:
        return None
    try:
        numbers = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecdraftError(f"{option} {text!r}: expected comma-separated numbers such as 0.8,0.6,0.5") from None
    if not all(math.isfinite(x) for x in numbers):
        raise SpecdraftError(f"{option} {text}: every value must be a finite number (no nan or inf), "
                             "e.g. 0.8,0.6,0.5")
    return numbers


def check_out(out, inputs: list, suffix: str, command: str | None = None):
    """--out for a results file: checked before minutes of work, not after; never another command's
    result in a run folder (`command`: the one writing it)."""
    if out is not None:
        from specdraft.io import check_file_target
        from specdraft.outputs import check_output_file
        from specdraft.run_layout import foreign_result

        check_file_target(out)
        check_output_file(out, inputs, suffix)
        owner = foreign_result(out, command) if command else None
        if owner:
            raise SpecdraftError(f"--out {out}: is `specdraft {owner}`'s result in the run {Path(out).parent}; "
                                 f"write {command}'s elsewhere (another name)")
    return out


# ----------------------------------------------------------------------------- help and "did you mean"

# Sub-commands in the order a user runs them (`specdraft --help` lists them so).
PIPELINE_ORDER = ("info", "prepare", "capture", "store", "vocab", "train", "eval", "bench", "generate", "plan",
                  "probe", "doctor", "export", "import", "report", "compare", "journal", "recipe", "demo")

# Flag names of neighbouring tools (SpecForge, speculators, vLLM, HF Trainer) -> ours, in the order tried:
# the first one the command has is suggested.
FOREIGN_FLAGS = {
    "--output-dir": ["--out"], "--output": ["--out"], "--output-path": ["--out"], "--save-dir": ["--out"],
    "--learning-rate": ["--lr"], "--num-epochs": ["--epochs"], "--num-train-epochs": ["--epochs"],
    "--target-model-path": ["--model"], "--target-model": ["--model"], "--model-path": ["--model"],
    "--verifier": ["--model"], "--draft-model": ["--drafter"], "--draft-model-path": ["--drafter"],
    "--speculative-num-steps": ["-k"], "--num-draft-tokens": ["-k"], "--k": ["-k"], "--steps": ["-k"],
    "--speculative-tokens": ["-k"], "--k-max": ["--max-k"],
    "--tp": ["-tp"], "--tp-size": ["-tp"], "--data-path": ["--conversations", "--prepared", "--store"],
    "--train-data-path": ["--conversations", "--prepared", "--store"], "--data": ["--conversations", "--prepared", "--store"],
    "--dataset": ["--conversations"], "--ttt-length": ["--ttt-steps"], "--max-length": ["--max-tokens"],
    "--max-grad-norm": ["--grad-clip"], "--batch-size": ["--rows-per-batch"], "--save-interval": ["--save-every"],
    "--eval-interval": ["--val-every"], "--log-interval": ["--log-every"], "--draft-vocab-size": ["--size"],
    "--dtype": ["--store-dtype", "--compute-dtype", "--weights-dtype"], "--torch-dtype": ["--compute-dtype"],
    "--profile": ["--time-split"], "--max-tokens": ["--tokens-per-sample"],
    "-k": ["--max-k"],   # plan's old name for the longest chain considered
}


# Flags of neighbouring tools whose setting lives in another specdraft command (or nowhere): said, instead
# of click's nearest spelling (train --draft-vocab-size once suggested --draft-layers)
ELSEWHERE = {
    "--draft-vocab-size": "the draft vocab size is set when the vocab is built: specdraft vocab build --size N "
                          "--out WS/vocab.safetensors, then pass --vocab WS/vocab.safetensors",
    "--size": "the draft vocab size is set when the vocab is built: specdraft vocab build --size N",
    "--chat-template": "specdraft renders with the target's own chat template (--model's tokenizer), the one "
                       "it serves with; a model folder whose tokenizer_config.json holds another renders with that",
}


def elsewhere(name: str, known: list[str]) -> Optional[str]:
    """Where a neighbouring tool's `name` lives when this command does not have it."""
    flag = name.split("=")[0]
    return ELSEWHERE.get(flag) if flag not in known else None


def suggestion(name: str, known: list[str]) -> Optional[str]:
    """Our flag for a neighbouring tool's `name`, when this command has it."""
    return next((ours for ours in FOREIGN_FLAGS.get(name.split("=")[0], []) if ours in known), None)


def plain_metavar(param) -> str:
    """What a value looks like, in words a user types (not Python's types)."""
    desc = param.type_descriptor
    if param.param_type_name == "argument":
        word = param.name.upper()
    elif desc.is_choice:
        word = "[" + "|".join(map(str, desc.choices)) + "]"
    elif desc.is_path:
        word = "PATH"
    else:
        inner = [a for a in typing.get_args(desc.annotation) if a is not type(None)] or [desc.annotation]
        word = {int: "N", float: "X"}.get(inner[0], "TEXT")
    return word + ("..." if param.nargs != 1 else "")


class PlainCommand(TyperCommand):
    """A command whose help shows values as PATH / N / TEXT, and whose unknown flags get our name
    for a neighbouring tool's one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.metavar is None and not getattr(param, "is_flag", False):
                param.metavar = plain_metavar(param)
            if param.param_type_name == "argument":   # its name says it; typer would add <path>
                param.display_type_rich = lambda ctx: None

    def parse_args(self, ctx, args):
        given = list(args)   # click consumes `args`
        try:
            return super().parse_args(ctx, args)
        except Exception as e:   # click's NoSuchOption (typer bundles its own click)
            if hasattr(e, "option_name") and hasattr(e, "possibilities"):
                known = [o for p in self.params for o in (*p.opts, *p.secondary_opts)]
                hint = suggestion(e.option_name, known)
                if hint:
                    e.possibilities = [hint]
                elif elsewhere(e.option_name, known):
                    e.possibilities = []
                    e.message = f"No such option: {e.option_name}; {elsewhere(e.option_name, known)}"
            json_file = json_flag_given_a_file(given, e)
            if json_file is not None:
                raise SpecdraftError(f"--json {json_file}: --json takes no value any more (it prints JSON to "
                                     f"stdout); write the file with --out {json_file}") from None
            raise


def json_flag_given_a_file(args: list[str], error) -> Optional[str]:
    """The old `--json FILE` (now --json prints and --out writes): the extra argument click refused
    right after --json, or None."""
    message = error.format_message() if hasattr(error, "format_message") else ""
    for flag, value in zip(args, args[1:]):
        if flag == "--json" and not value.startswith("-") and "unexpected extra argument" in message \
                and value in message:
            return value
    return None


class PipelineGroup(TyperGroup):
    """A group whose --help lists sub-commands in pipeline order."""

    def list_commands(self, ctx):
        order = {name: i for i, name in enumerate(PIPELINE_ORDER)}
        return sorted(self.commands, key=lambda name: order.get(name, len(order)))


def plain_app(help: str, **kwargs) -> typer.Typer:
    """A Typer with plain help: wrapped to 80 columns (rich tables cut text with …), no Python types."""
    return typer.Typer(cls=PipelineGroup, rich_markup_mode=None, no_args_is_help=True, add_completion=False,
                       pretty_exceptions_enable=False, help=help, **kwargs)


def command(group: typer.Typer, name: Optional[str] = None, **kwargs):
    """`@command(app)`: register a function as a PlainCommand, its numbers checked before its body."""
    def register(func):
        group.command(name, cls=PlainCommand, **kwargs)(numbers_checked_first(func))
        return func
    return register


# ----------------------------------------------------------------------------- output and the entry point

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


VERSION = typer.Option(False, "--version", callback=version_callback, is_eager=True, help="Print the version and exit.")


def run_cli(app) -> None:
    """The entry point's frame: bad input becomes one line on stderr and exit code 2, never a traceback.

    OS errors that no writer turned into a message (a full disk, a path that is a folder, no
    permission) are bad input too: one line naming the path. SPECDRAFT_DEBUG=1 shows the traceback.
    Output to a file or pipe is never wrapped (a log keeps paths and tables whole)."""
    import os

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
        console.print(Text.assemble(("error:", "red"), f" {line}"), highlight=False, soft_wrap=True)   # never markup
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
