"""Where a training run keeps its files: RUN (train's --out) laid out once, for every command.

    RUN/config.yaml           the run's settings (RunConfig), what --resume continues
    RUN/metrics.jsonl         one record per logged train step and per validation
    RUN/best/                 the checkpoint with the best validation (a drafter folder)
    RUN/checkpoints/epoch-N/  the checkpoint after epoch N; step-N/ within an epoch
    RUN/journal.md, remap.json, provenance.json, tensorboard/, wandb/
    RUN/bench.json            bench on the builtin hold-out prompts (the recipe's bench stage)
    RUN/bench_natural.json    bench on the natural prompt set at the served K (the report's headline τ)
    RUN/bench_vllm.json       bench --engine vllm: the export served by vLLM against vLLM's plain decoding
    RUN/eval.json             eval: simulated τ on the run's held-out store samples
    RUN/plan.json             plan --run: the K and speed plan from measured costs
    RUN/doctor.json           doctor: the last diagnosis
    RUN/report.html           report: the run on one page

An export is not written here: its folder keeps its own record (EXPORT/export.json, schemas/exports.py) naming
the run, and the run's readers find it there.

train writes it (train/loop.py, train/run_folder.py); eval, bench, export, report, compare and the
recipe read it through these names, and `checkpoints` is the one lister of RUN/checkpoints. It
imports nothing of specdraft (the lowest import layer), so io, journal and metrics use it too;
tests/test_layout.py refuses a RUN name spelled anywhere else.
"""

from __future__ import annotations

import re
from pathlib import Path

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
BEST = "best"
CHECKPOINTS = "checkpoints"
REMAP = "remap.json"
JOURNAL = "journal.md"
PROVENANCE = "provenance.json"
# what `train` writes in RUN: --overwrite deletes these; the first four mean "RUN already holds a run"
RUN_FILES = (METRICS, CONFIG, CHECKPOINTS, BEST, REMAP, JOURNAL, "tensorboard", "wandb", PROVENANCE)
BENCH = "bench.json"
BENCH_NATURAL = "bench_natural.json"
BENCH_VLLM = "bench_vllm.json"
EVAL = "eval.json"
PLAN = "plan.json"
DOCTOR = "doctor.json"
LEGACY_EXPORTS = "exports.json"   # where exports were listed before EXPORT/export.json (read, no longer written)
REPORT = "report.html"
CHECKPOINT_NAME = re.compile(r"^(epoch|step)-(\d+)$")
# RUN's files and the command that writes each: another command's --out never lands on one
OWNERS = {EVAL: "eval", BENCH: "bench", BENCH_NATURAL: "bench", BENCH_VLLM: "bench", PLAN: "plan", DOCTOR: "doctor",
          REPORT: "report",
          **{name: "train" for name in RUN_FILES}}


SHARED = (JOURNAL,)      # the decision journal: train, probe, plan and watch append to it (journal.py, under a lock)


def may_write(command: str, name: str) -> bool:
    """Whether `command` may write RUN/`name` (a file of RUN's top level, or its first path part): its own files
    (OWNERS, train every RUN_FILES name), the shared journal, a lock file, or a bench plot beside its JSON."""
    stem = name.rsplit(".", 1)[0]
    return (OWNERS.get(name) == command or name in SHARED or name.endswith(".lock")
            or name.endswith(".png") and OWNERS.get(stem + ".json") == command)


def foreign_result(out: Path, command: str) -> str | None:
    """The command whose result `out` is, when it names a file of a run folder that another command writes."""
    out = Path(out)
    owner = OWNERS.get(out.name)
    is_run = (out.parent / METRICS).is_file() or (out.parent / CONFIG).is_file()
    return owner if owner is not None and owner != command and is_run else None


def config_file(run: Path) -> Path:
    return Path(run) / CONFIG


def metrics_file(run: Path) -> Path:
    return Path(run) / METRICS


def best_dir(run: Path) -> Path:
    return Path(run) / BEST


def checkpoint_dir(run: Path, kind: str, n: int) -> Path:
    """RUN/checkpoints/epoch-N or step-N."""
    return Path(run) / CHECKPOINTS / f"{kind}-{n}"


def checkpoints(run: Path, kind: str | None = None, holding: tuple[str, ...] = ("config.json",)) \
        -> list[tuple[str, int, Path]]:
    """(kind, N, folder) of the checkpoints RUN/checkpoints/epoch-N and step-N (only `kind`'s when
    given) that hold every file in `holding`, by kind, then N: the one lister of a run's checkpoints."""
    root = Path(run) / CHECKPOINTS
    found = []
    for folder in root.iterdir() if root.is_dir() else ():
        m = CHECKPOINT_NAME.match(folder.name)
        if m and kind in (None, m.group(1)) and all((folder / name).is_file() for name in holding):
            found.append((m.group(1), int(m.group(2)), folder))
    return sorted(found)


def holds_run(folder: Path) -> bool:
    """Whether `folder` holds a training run (any of the files that mean one)."""
    return any((Path(folder) / name).exists() for name in RUN_FILES[:4])
