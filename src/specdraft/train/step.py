"""One optimizer step, validation, and the state a run carries from step to step.

`Training` holds what a run built once (drafter, objective, optimizer, schedule, logs); `TrainState`
holds what changes each step and goes into every checkpoint's trainer_state.pt; `train_step` does
one step on one batch and returns what the loop logs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specdraft.watch import BaselineWatch
from specdraft.errors import SpecdraftError
from specdraft.metrics import MetricsLog
from specdraft.train import checkpoint as ckpt
from specdraft.train.config import RunConfig
from specdraft.train.objective import add_sums, finalize_metrics
from specdraft.train.run_folder import note
from specdraft.train.runtime import Batches, Runtime, TrainData, replicated


@dataclass
class TrainState:
    """Progress of a run, saved in trainer_state.pt under these names and restored on --resume."""

    epoch: int = 0
    batch: int = 0                      # next batch index in `epoch` (the data position)
    step: int = 0                       # optimizer steps taken
    tokens_seen: int = 0                # real tokens trained on, all ranks
    best_val: float = float("inf")      # lowest validation loss so far (best/)
    window: dict | None = None          # metric sums since the last train record

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_saved(cls, saved: dict) -> "TrainState":
        return cls(**{f.name: saved[f.name] for f in dataclasses.fields(cls)})


@dataclass
class Training:
    """What one run built before its first step; the loop reads it and advances `state`."""

    cfg: RunConfig
    runtime: Runtime
    data: TrainData
    drafter: torch.nn.Module
    model: torch.nn.Module              # the TTT objective, wrapped by the runtime (DDP / FSDP2)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    metrics: MetricsLog
    watch: BaselineWatch | None
    log: Callable[[str], None]          # console messages, rank 0 only
    bf16: bool
    batches_per_epoch: list[int]
    state: TrainState = field(default_factory=TrainState)
    steps_this_run: int = 0             # for --stop-after
    last_val: dict = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.out)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return self.optimizer.param_groups[0]["params"]


@dataclass
class StepResult:
    loss: torch.Tensor                  # this rank's loss (0-dim, detached)
    sums: dict[str, torch.Tensor]       # this rank's metric sums (objective.add_sums form)
    grad_norm: torch.Tensor             # after clipping's measurement, the same on every rank
    tokens: int                         # real tokens of the global batch (all ranks)
    lr: float                           # the learning rate this step used


# ----------------------------------------------------------------------------- optimizer and schedule

def lr_lambda(cfg: RunConfig, total_steps: int) -> Callable[[int], float]:
    """Linear warm-up to lr, then cosine/linear decay to lr * min_lr_ratio (or constant).

    Not transformers' get_*_schedule_with_warmup: those warm up from 0 (step / warmup, ours
    (step + 1) / (warmup + 1)), reach the end of the decay one step later, and decay linearly to 0,
    not to min_lr_ratio; switching would change every run's learning rates."""
    warmup = max(0, min(cfg.warmup_steps, total_steps - 1))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup - 1))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return factor


def restore_state(resume_from: Path, drafter: torch.nn.Module, optimizer, scheduler) -> TrainState:
    """--resume: the optimizer, the schedule and the RNG as the checkpoint saved them, and where it stopped."""
    saved = ckpt.load_trainer_state(resume_from)
    ckpt.load_optimizer_state(drafter, optimizer, saved["optimizer"])   # collective under FSDP2
    scheduler.load_state_dict(saved["scheduler"])
    ckpt.set_rng_state(saved["rng"])
    return TrainState.from_saved(saved)


def optimizer_and_schedule(cfg: RunConfig, drafter: torch.nn.Module, total_steps: int):
    """AdamW over the trainable parameters, with the learning-rate schedule over the whole run."""
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_steps))


# ----------------------------------------------------------------------------- the step

def train_step(t: Training, batch: dict[str, torch.Tensor], index: int) -> StepResult:
    """One optimizer step on this rank's rows of a global batch (`index` in the epoch). Collective
    under DDP/FSDP2; refuses a non-finite loss or gradient on any rank before the weights change."""
    cfg, runtime = t.cfg, t.runtime
    batch = {k: v.to(runtime.device) for k, v in batch.items()}
    if cfg.train_on_prompts:   # the target's distribution is the teacher at prompt tokens too
        batch["loss_mask"] = torch.ones_like(batch["loss_mask"])
    lr = t.optimizer.param_groups[0]["lr"]
    with torch.autocast(runtime.device.type, dtype=torch.bfloat16, enabled=t.bf16):
        loss, sums = t.model(batch)
    t.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(t.params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
    grad_norm = replicated(grad_norm)    # FSDP2 returns a DTensor; a plain tensor stays as is
    refuse_non_finite(t, loss, grad_norm, index)
    t.optimizer.step()
    t.scheduler.step()
    tokens = int(runtime.reduce_sums({"tokens": (batch["doc_ids"] >= 0).sum().double()})["tokens"])
    return StepResult(loss.detach(), sums, grad_norm, tokens, lr)


def refuse_non_finite(t: Training, loss: torch.Tensor, grad_norm: torch.Tensor, index: int) -> None:
    """Collective: a NaN on one rank stops every rank here, before the weights change (backward ran
    everywhere, so no rank waits in DDP's gradient all_reduce). The last checkpoint stays intact."""
    bad = t.runtime.reduce_sums({"loss": (~torch.isfinite(loss.detach())).double(),
                                 "grad_norm": (~torch.isfinite(grad_norm.detach())).double()})
    if not (float(bad["loss"]) or float(bad["grad_norm"])):
        return
    what, value, key = ("loss", loss, "loss") if float(bad["loss"]) else ("gradient norm", grad_norm, "grad_norm")
    last = ckpt.latest_checkpoint(t.run_dir)
    kept = f"last good checkpoint {last} is intact" if last else "no checkpoint was written yet"
    local = float(value.detach())
    shown = str(local) if not math.isfinite(local) else "not finite"
    where = f" on {int(float(bad[key]))} of {t.runtime.world_size} ranks" if t.runtime.world_size > 1 else ""
    error = SpecdraftError(f"training stopped: {what} is {shown}{where} at step {t.state.step + 1} (epoch "
                           f"{t.state.epoch + 1}, batch {index}); {kept}; check the store for inf/NaN or lower --lr")
    if t.runtime.is_main:
        note(t.run_dir, "warning", str(error))
    raise error


def advance(state: TrainState, index: int, step: StepResult) -> None:
    """Count a finished step: its data position, tokens, and its metric sums in the log window."""
    state.step += 1
    state.batch = index + 1
    state.tokens_seen += step.tokens
    state.window = add_sums(state.window, step.sums)


def evaluate(model: torch.nn.Module, batches: Batches, runtime: Runtime, bf16: bool) -> dict:
    """Validation metrics over all of `batches` (summed over ranks); {} when there are none."""
    model.eval()
    sums = None
    with torch.no_grad():
        for batch in batches.batches(0):              # read outside autocast: its collate stacks fp8 rows
            batch = {k: v.to(runtime.device) for k, v in batch.items()}
            with torch.autocast(runtime.device.type, dtype=torch.bfloat16, enabled=bf16):
                sums = add_sums(sums, model(batch)[1])
    model.train()
    return finalize_metrics(runtime.reduce_sums(sums)) if sums is not None else {}
