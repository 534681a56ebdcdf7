"""The training recipe, top to bottom: `train` owns the run folder; `start` checks the inputs and
builds the drafter, optimizer and logs (or restores them on --resume); `run_epoch` takes the steps
of one epoch (train/step.py) and `end_epoch` validates and checkpoints it; `decide_stop` is the
one place a run stops early.

What distributed or online training swaps in is a `Runtime` and a `TrainData` (train/runtime.py);
the defaults are one process reading the hidden store.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from rich.console import Console

from specdraft import run_layout
from specdraft import vocab as vocab_mod
from specdraft.errors import SpecdraftError
from specdraft.families import family_of
from specdraft.io import write_json
from specdraft.metrics import MetricsLog
from specdraft.train import checkpoint as ckpt
from specdraft.train.baseline import load_watch, replay_run, watch_record
from specdraft.train.config import RunConfig, save_yaml
from specdraft.train.drafters import start_drafter
from specdraft.train.inputs import INPUTS_FILE, check_inputs, data_identity, store_data, training_target
from specdraft.train.objective import TeacherHead, add_sums, finalize_metrics
from specdraft.train.progress import progress_bar
from specdraft.train.provenance import write_provenance
from specdraft.train.run_folder import (check_resume_settings, note, nothing_to_resume, own_run_folder, set_aside,
                                        start_summary, val_summary)
from specdraft.train.runtime import Runtime, TrainData, use_bf16
from specdraft.train.step import (StepResult, Training, TrainState, advance, evaluate, optimizer_and_schedule,
                                  restore_state, train_step)


def train(cfg: RunConfig, runtime: Runtime | None = None, data: TrainData | None = None,
          target=None) -> dict:
    """Run (or resume) training as configured; returns a summary (steps, tokens, last val metrics)."""
    cfg.check()
    runtime = runtime or Runtime()
    with own_run_folder(cfg, runtime):
        t = start(cfg, runtime, data, target)
        shown = cfg.progress and runtime.is_main   # the bar on the console the epoch tables use: lines never mix
        with t.metrics, progress_bar(shown, sum(t.batches_per_epoch), t.state.step, t.metrics.console) as bar:
            for epoch in range(t.state.epoch, cfg.epochs):
                t.state.epoch = epoch
                stopped = run_epoch(t, epoch, bar)
                if stopped is not None:
                    return stopped
        return {"steps": t.state.step, "tokens_seen": t.state.tokens_seen, "val": t.last_val,
                "best_val_loss": t.state.best_val}


# ----------------------------------------------------------------------------- start

def start(cfg: RunConfig, runtime: Runtime, data: TrainData | None, target) -> Training:
    """Check the inputs, then build (or restore) what the steps need. Nothing in RUN changes before
    every check has passed."""
    if cfg.attention == "flex" and runtime.device.type != "cuda":
        raise SpecdraftError("--attention flex: needs a CUDA device (flex attention compiles for GPUs); "
                             "use --attention sdpa on CPU")
    console = Console(stderr=True)
    log = (lambda msg: console.print(msg, highlight=False, soft_wrap=True, markup=False)) if runtime.is_main else (lambda msg: None)
    resume_from = resume_checkpoint(cfg) if cfg.resume else None
    if cfg.resume:
        check_resume_settings(cfg)
    vocab = vocab_mod.load(cfg.vocab)
    data = data or store_data(cfg, runtime)
    target = target or training_target(cfg)
    check_inputs(cfg, data, target, vocab)
    watch = load_watch(cfg, Path(cfg.out)) if cfg.baseline else None

    drafter, remap_report = start_drafter(cfg, resume_from, target, vocab, data, log)
    drafter.to(runtime.device).train()
    teacher = TeacherHead.from_target(target.model, vocab.d2t).to(runtime.device)
    objective = family_of(drafter).objective(drafter, teacher, cfg)     # forward(batch) -> (loss, sums)
    model = runtime.wrap_model(objective)     # before the optimizer: FSDP2 replaces the parameters
    batches_per_epoch = [data.train.num_batches(e) for e in range(cfg.epochs)]
    if sum(batches_per_epoch) == 0:
        raise SpecdraftError(f"{data.source}: no training samples (val_fraction {cfg.val_fraction} took them all?)")
    optimizer, scheduler = optimizer_and_schedule(cfg, drafter, sum(batches_per_epoch))
    state = restore_state(resume_from, drafter, optimizer, scheduler) if resume_from is not None else TrainState()
    # every input check passed: only now set the old run aside, start the trackers (wandb may refuse:
    # the old run is put back), and delete it once they started
    with set_aside(Path(cfg.out), log) if runtime.is_main and cfg.overwrite else contextlib.nullcontext():
        metrics = MetricsLog(Path(cfg.out), runtime.is_main, console, cfg.report_to, cfg.to_dict())
    t = Training(cfg, runtime, data, drafter, model, optimizer, scheduler, metrics, watch, log,
                 use_bf16(cfg, runtime.device), batches_per_epoch, state)
    open_run(t, resume_from, remap_report)
    return t


def resume_checkpoint(cfg: RunConfig) -> Path:
    """--resume: the run's latest checkpoint (epoch-N or step-N)."""
    found = ckpt.latest_checkpoint(Path(cfg.out))
    if found is None:
        raise nothing_to_resume(Path(cfg.out))
    return found


def open_run(t: Training, resume_from: Path | None, remap_report: dict | None) -> None:
    """RUN/config.yaml (and remap.json), metrics.jsonl cut at the resumed step, the start message,
    the watch caught up with the run so far, and the run-start journal entry."""
    cfg, run_dir, total_steps = t.cfg, t.run_dir, sum(t.batches_per_epoch)
    if t.runtime.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_yaml(cfg.replace(overwrite=False), run_layout.config_file(run_dir))   # a --resume of it must not wipe
        write_provenance(run_dir, t.runtime.device, t.runtime.world_size, resumed=resume_from is not None)
        if remap_report is not None:
            write_json(run_dir / run_layout.REMAP, remap_report)
        t.metrics.truncate_after(t.state.step)
    t.log(f"training {sum(p.numel() for p in t.params):,} parameters, {total_steps} steps, "
          f"TTT {cfg.ttt_steps}, {'bf16 autocast' if t.bf16 else 'fp32'} -> {run_dir}")
    if t.watch is not None and resume_from is not None:
        replay_run(t.watch, run_dir, t.log)
    if t.runtime.is_main:
        note(run_dir, "decision", start_summary(cfg, resume_from, remap_report, total_steps,
                                                t.state.step, t.state.tokens_seen))


# ----------------------------------------------------------------------------- epochs

def run_epoch(t: Training, epoch: int, bar) -> dict | None:
    """The steps of one epoch from the saved data position, then its validation and checkpoints.
    Returns the run's summary when the run stops early, else None."""
    started, epoch_tokens, epoch_sums, behind = time.perf_counter(), 0, None, False
    for index, batch in enumerate(t.data.train.batches(epoch, t.state.batch), t.state.batch):
        step = train_step(t, batch, index)
        advance(t.state, index, step)
        epoch_tokens += step.tokens
        epoch_sums = add_sums(epoch_sums, step.sums)
        t.steps_this_run += 1
        bar(step.tokens, step.sums)
        last_of_epoch = index + 1 == t.batches_per_epoch[epoch]
        behind = after_step(t, step, last_of_epoch)
        stopped = decide_stop(t, behind, last_of_epoch)
        if stopped is not None:
            return stopped
    elapsed = time.perf_counter() - started
    behind = end_epoch(t, epoch, epoch_sums, epoch_tokens / elapsed if elapsed > 0 else 0.0) or behind
    return decide_stop(t, behind, epoch_done=True)


def after_step(t: Training, step: StepResult, last_of_epoch: bool) -> bool:
    """Log every log_every steps, validate every val_every, checkpoint every save_every (the last
    step of an epoch does all three in end_epoch). True when the baseline watch says stop."""
    cfg, state, behind = t.cfg, t.state, False
    if state.step % cfg.log_every == 0 or last_of_epoch:
        behind = record(t, "train", finalize_metrics(t.runtime.reduce_sums(state.window)), step.lr,
                        grad_norm=float(step.grad_norm))
        state.window = None
    if cfg.val_every and state.step % cfg.val_every == 0 and t.data.val is not None and not last_of_epoch:
        behind = record(t, "val", evaluate(t.model, t.data.val, t.runtime, t.bf16), step.lr) or behind
    if cfg.save_every and state.step % cfg.save_every == 0 and not last_of_epoch:
        save(t, run_layout.checkpoint_dir(t.run_dir, "step", state.step))
        if t.runtime.is_main:
            ckpt.prune_step_checkpoints(t.run_dir, cfg.keep_step_checkpoints)
    return behind


def end_epoch(t: Training, epoch: int, epoch_sums: dict | None, tokens_per_s: float) -> bool:
    """Validate, print the epoch table, write best/ (on a new lowest validation loss) and the epoch
    checkpoint. True when the baseline watch says stop."""
    runtime, state, behind = t.runtime, t.state, False
    lr = t.optimizer.param_groups[0]["lr"]
    rows = [("train", finalize_metrics(runtime.reduce_sums(epoch_sums)))] if epoch_sums else []
    if t.data.val is not None:
        t.last_val = evaluate(t.model, t.data.val, runtime, t.bf16)
        behind = record(t, "val", t.last_val, lr)
        rows.append(("val", t.last_val))
    t.metrics.epoch_table(epoch, rows, t.cfg.ttt_steps, tokens_per_s)
    state.epoch, state.batch = epoch + 1, 0
    val_loss = t.last_val.get("loss", float("nan"))
    new_best = bool(t.last_val) and val_loss < state.best_val
    if new_best:
        # best/ before the epoch checkpoint: a kill between the two saves resumes from the
        # previous epoch, which recomputes this same best, so best/ is never left stale.
        state.best_val = val_loss
        tensors, _ = ckpt.training_state(t.drafter)      # collective under FSDP2
        if runtime.is_main:
            ckpt.save(run_layout.best_dir(t.run_dir), t.drafter, tensors=tensors,
                      extra_json={"val.json": {"epoch": epoch + 1, "step": state.step, **t.last_val},
                                  INPUTS_FILE: data_identity(t.data)})   # the model card's data and fingerprint
        runtime.barrier()
    save(t, run_layout.checkpoint_dir(t.run_dir, "epoch", epoch + 1), t.last_val)
    if new_best and runtime.is_main:
        note(t.run_dir, "result", f"new best: epoch {epoch + 1}, step {state.step}, "
                                  f"{state.tokens_seen:,} tokens: {val_summary(t.last_val, t.cfg.ttt_steps)} -> {run_layout.best_dir(t.run_dir)}")
    return behind


def decide_stop(t: Training, behind: bool, last_of_epoch: bool = False, epoch_done: bool = False) -> dict | None:
    """The one place a run stops early; returns its summary, or None to go on. --stop-if-behind:
    mid-epoch at once (after a step checkpoint), at the end of an epoch after its validation and
    checkpoint (unless it was the last). --stop-after N: after N steps of this process."""
    cfg, state = t.cfg, t.state
    if epoch_done:
        if behind and state.epoch < cfg.epochs:
            return stopped_behind(t, run_layout.checkpoint_dir(t.run_dir, "epoch", state.epoch))
        return None
    if behind and not last_of_epoch:
        folder = run_layout.checkpoint_dir(t.run_dir, "step", state.step)
        if not (cfg.save_every and state.step % cfg.save_every == 0):
            save(t, folder)
        return stopped_behind(t, folder)
    if cfg.stop_after and t.steps_this_run >= cfg.stop_after:
        return {"stopped_at_step": state.step, "tokens_seen": state.tokens_seen}
    return None


def stopped_behind(t: Training, folder: Path) -> dict:
    """--stop-if-behind fired: the checkpoint in `folder` is written; say so and where."""
    state = t.state
    text = (f"stopped at step {state.step} ({state.tokens_seen:,} tokens) by --stop-if-behind: "
            f"behind baseline {t.cfg.baseline}; checkpoint {folder} (inspect it, or continue with "
            f"`specdraft train --out {t.run_dir} --resume`)")
    t.log(text)   # printed as written (markup=False): paths may hold [..]
    if t.runtime.is_main:
        note(t.run_dir, "decision", text)
    return {"steps": state.step, "tokens_seen": state.tokens_seen, "val": t.last_val,
            "best_val_loss": state.best_val, "stopped": "behind baseline", "checkpoint": str(folder)}


# ----------------------------------------------------------------------------- records and checkpoints

def record(t: Training, split: str, metrics: dict, lr: float, **extra) -> bool:
    """Log one metrics.jsonl record and feed it to the baseline watch (collective with a baseline)."""
    s = t.state
    rec = {"split": split, "epoch": s.epoch, "step": s.step, "tokens_seen": s.tokens_seen, "lr": lr,
           "metrics": metrics, **extra}
    t.metrics.write(rec)
    return watch_record(t.watch, rec, t.cfg, t.runtime, t.log)


def save(t: Training, folder: Path, val: dict | None = None) -> None:
    """A training checkpoint. Collective: every rank calls it (FSDP2 gathers the shards); rank 0 writes."""
    tensors, optimizer_state = ckpt.training_state(t.drafter, t.optimizer)
    trainer_state = {"optimizer": optimizer_state, "scheduler": t.scheduler.state_dict(),
                     "rng": ckpt.rng_state(), **t.state.to_dict()}
    progress = {k: getattr(t.state, k) for k in ("epoch", "batch", "step", "tokens_seen")}
    extra = {ckpt.PROGRESS_FILE: progress, INPUTS_FILE: data_identity(t.data)}
    if val:
        extra["val.json"] = val
    if t.runtime.is_main:
        ckpt.save(folder, t.drafter, trainer_state, extra, tensors=tensors)
    t.runtime.barrier()
