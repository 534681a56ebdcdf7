"""`train --report-to`: experiment trackers fed the same scalars as RUN/metrics.jsonl.

metrics.jsonl stays the run's record (compare, report, resume read it); a tracker is a view of it
for people who already use one. Each is an optional extra, checked before training starts so a
missing package costs seconds, not an epoch. Only rank 0 opens them (MetricsLog's writer).
Not accelerate.tracking: its trackers ask accelerate's PartialState at every call (state the loop's own
torch.distributed setup owns), and its TensorBoard stores the config with add_hparams, which refuses the
config's lists and writes a second, timestamped run folder; the wrappers below are a line or two each.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from specdraft.errors import SpecdraftError

# tracker -> the module that must import (tensorboard is written through torch.utils.tensorboard)
TRACKERS = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}
PROJECT = "specdraft"


def parse(report_to: str) -> list[str]:
    """'wandb,tensorboard' -> ['wandb', 'tensorboard']; 'none' or '' -> []. Unknown names are refused."""
    names = [n.strip() for n in report_to.split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise SpecdraftError(f"--report-to {report_to}: unknown tracker {', '.join(unknown)}; "
                             f"use none or a comma list of {', '.join(TRACKERS)}")
    return list(dict.fromkeys(names))


def require(report_to: str) -> None:
    """Import each tracker's package now, so a missing one fails before training, as one line (the
    extra specdraft[NAME] installs the same package; rich markup would eat its brackets)."""
    for name in parse(report_to):
        try:
            importlib.import_module(TRACKERS[name])
        except ImportError:
            raise SpecdraftError(f"--report-to {name}: {name} is not installed; pip install {name}") from None


def scalars(record: dict) -> dict:
    """What a metrics.jsonl record shows in a tracker: split/metric plus lr, grad_norm, tokens_seen."""
    values = {f"{record['split']}/{k}": v for k, v in record["metrics"].items()}
    values.update({k: record[k] for k in ("lr", "grad_norm", "tokens_seen") if k in record})
    return values


class TensorBoard:
    def __init__(self, run_dir: Path, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in config.items()))

    def log(self, values: dict, step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class Trackio:
    """Local-first: a sqlite database under TRACKIO_DIR (default ~/.cache/huggingface/trackio);
    `trackio show` is the dashboard, never launched from here."""

    def __init__(self, run_dir: Path, config: dict):
        import trackio

        self.trackio = trackio
        trackio.init(project=PROJECT, name=run_dir.name, config=config, embed=False,
                     auto_log_cpu=False, auto_log_gpu=False)

    def log(self, values: dict, step: int) -> None:
        self.trackio.log(values, step=step)

    def close(self) -> None:
        self.trackio.finish()


class Wandb:
    """Respects the user's wandb settings; WANDB_MODE=offline writes the run under WANDB_DIR
    (default: the run folder) with no network, for a later `wandb sync`."""

    def __init__(self, run_dir: Path, config: dict):
        import wandb

        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=run_dir.name,
                                  config=config, dir=os.environ.get("WANDB_DIR", str(run_dir)))
        except Exception as e:   # no API key, no network: say how to run without either
            raise SpecdraftError(f"--report-to wandb: {str(e).splitlines()[0] if str(e) else type(e).__name__}; "
                                 "`wandb login`, or set WANDB_MODE=offline to log locally") from None

    def log(self, values: dict, step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def open_trackers(report_to: str, run_dir: Path, config: dict) -> list:
    """The trackers named by --report-to, each started with the run's config."""
    kinds = {"tensorboard": TensorBoard, "trackio": Trackio, "wandb": Wandb}
    opened = []
    try:
        for name in parse(report_to):
            opened.append(kinds[name](run_dir, config))
    except BaseException:   # one refused (wandb without a login): close those already started
        for tracker in opened:
            tracker.close()
        raise
    return opened
