"""The run folder RUN: who owns it while training, what a new run may find there, what
--overwrite deletes, and the entries training adds to RUN/journal.md."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from specdraft import journal
from specdraft import run_layout
from specdraft.errors import SpecdraftError
from specdraft.outputs import own_folder
from specdraft.metrics import tau_text
from specdraft.train.checkpoint import STATE_FILE
from specdraft.train.config import RunConfig
from specdraft.train.runtime import Runtime, any_rank

RUN_FILES = run_layout.RUN_FILES   # what `train` writes in RUN (run_layout.py): --overwrite deletes these


@contextlib.contextmanager
def own_run_folder(cfg: RunConfig, runtime: Runtime):
    """Rank 0 locks RUN for the whole run (a second train into it fails at once) and refuses a
    folder that already holds a run unless --resume or --overwrite. Collective: every rank learns
    the outcome, so no rank waits in a collective for a rank 0 that gave up."""
    with contextlib.ExitStack() as held:
        error = None
        if runtime.is_main:
            try:
                held.enter_context(own_folder(cfg.out, "train"))
                recover_set_aside(Path(cfg.out))
                check_run_folder(cfg)
            except SpecdraftError as e:
                error = e
        if any_rank(runtime, error is not None):
            raise error or SpecdraftError(f"{cfg.out}: refused by rank 0 (its message says why)")
        yield


def check_run_folder(cfg: RunConfig) -> None:
    """Training into a finished or running run without --resume used to empty its metrics,
    replace best/ and keep its later checkpoints: two runs mixed in one folder."""
    run_dir = Path(cfg.out)
    held = [name + ("/" if (run_dir / name).is_dir() else "") for name in RUN_FILES[:4] if (run_dir / name).exists()]
    if held and not (cfg.resume or cfg.overwrite):
        if not run_layout.checkpoints(run_dir, holding=(STATE_FILE,)):
            raise SpecdraftError(f"{run_dir}: already holds a run that stopped before its first checkpoint "
                                 f"({', '.join(held)}; --resume has nothing to continue); pass --overwrite to "
                                 "start over, or choose another --out")
        raise SpecdraftError(f"{run_dir}: already holds a run ({', '.join(held)}); pass --resume to continue it, "
                             "--overwrite to start over, or choose another --out")


def nothing_to_resume(run_dir: Path) -> SpecdraftError:
    """--resume without a checkpoint. A started run is refused without --resume too (check_run_folder),
    so that one is sent to --overwrite, not back (issue 36: the two messages sent the user in a loop)."""
    if run_layout.holds_run(run_dir):
        return SpecdraftError(f"{run_dir}: no checkpoint to resume from: the run stopped before its first one "
                              "(one per epoch; --save-every N adds one every N steps), so there is nothing to "
                              "continue; start it over with --overwrite instead of --resume")
    return SpecdraftError(f"{run_dir}: no checkpoint to resume from (checkpoints/epoch-N or step-N with "
                          "trainer_state.pt); start without --resume")


# --overwrite sets the old run aside here (one rename per file) while the new run's trackers start:
# a tracker that refuses (wandb without a login) puts it back; once they started, it is deleted.
SET_ASIDE = ".overwritten"


@contextlib.contextmanager
def set_aside(run_dir: Path, log):
    """--overwrite, in the order README promises: move the old run's files into RUN/.overwritten,
    run the block (open the trackers), then delete them; if the block fails, the old run is put
    back as it was and the error goes on."""
    aside = run_dir / SET_ASIDE
    names = [name for name in RUN_FILES if (run_dir / name).exists() or (run_dir / name).is_symlink()]
    if not names:
        yield
        return
    aside.mkdir()
    for name in names:
        (run_dir / name).rename(aside / name)
    try:
        yield
    except BaseException:
        restore_set_aside(run_dir)
        raise
    dropped = run_dir / (SET_ASIDE + "-drop")     # renamed first: a half-deleted old run is never restored
    aside.rename(dropped)
    shutil.rmtree(dropped)
    log(f"--overwrite: deleted the previous run's {', '.join(names)}")


def restore_set_aside(run_dir: Path) -> list[str]:
    """Put the files of RUN/.overwritten back, replacing what the failed start made in their place."""
    aside = run_dir / SET_ASIDE
    for name in RUN_FILES:        # made by the start that failed (a tracker's folder): not the old run's
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    names = sorted(p.name for p in aside.iterdir())
    for name in names:
        (aside / name).rename(run_dir / name)
    aside.rmdir()
    return names


def recover_set_aside(run_dir: Path) -> None:
    """A train --overwrite killed while its trackers started left the old run in RUN/.overwritten:
    put it back (the new run had not begun), or finish deleting one that was being deleted."""
    dropped = run_dir / (SET_ASIDE + "-drop")
    if dropped.is_dir():
        shutil.rmtree(dropped)
    if (run_dir / SET_ASIDE).is_dir():
        names = restore_set_aside(run_dir)
        from rich.console import Console

        Console(stderr=True).print(f"{run_dir}: restored the previous run's {', '.join(names)} that an "
                                   "interrupted --overwrite had set aside in .overwritten", highlight=False, soft_wrap=True,
                                   markup=False)


# what a --resume may change: how the run is watched, logged and launched, how long it goes on (the
# schedule follows --epochs), and the paths of its inputs (their contents are checked against the
# checkpoint). Any other setting was baked into the optimizer, scheduler, split or weights.
RESUME_MAY_CHANGE = {"out", "resume", "overwrite", "progress", "stop_after", "log_every", "val_every", "save_every",
                     "keep_step_checkpoints", "report_to", "epochs", "baseline", "stop_if_behind", "watch_split",
                     "watch_metric", "watch_margin", "watch_warmup_tokens", "watch_min_points", "store", "vocab",
                     "model", "trust_remote_code", "attention"}


def check_resume_settings(cfg: RunConfig) -> None:
    """--resume continues the run as recorded in RUN/config.yaml: a setting that differs (a flag or
    --config) would be written to config.yaml while the restored optimizer, schedule and split keep
    the old one, so the differences are refused, each as --flag old -> new. A missing or damaged
    record is refused too (defaults would change the split mid-run)."""
    from specdraft.train.config import flag, load_yaml

    path = run_layout.config_file(Path(cfg.out))
    fix = "restore it, or start a new run in another --out"
    if not path.is_file():
        raise SpecdraftError(f"{path}: not found; --resume continues a run with its recorded settings; {fix}")
    try:
        saved = RunConfig.from_dict(load_yaml(path), str(path))
    except SpecdraftError as e:
        raise SpecdraftError(f"{e}; --resume needs the run's record of its settings: {fix}") from None
    differ = [f"{flag(name)} {getattr(saved, name)} -> {getattr(cfg, name)}"
              for name in saved.to_dict() if name not in RESUME_MAY_CHANGE and getattr(saved, name) != getattr(cfg, name)]
    if differ:
        raise SpecdraftError(f"{path}: --resume continues the run with its recorded settings, but these differ: "
                             f"{', '.join(differ)}; drop those flags (or --config) to resume, or start a new run "
                             "in another --out")


def note(run_dir: Path, kind: str, text: str) -> None:
    """An automatic RUN/journal.md entry from training (rank 0 only; callers check)."""
    journal.record(run_dir, kind, text, source="train")


def val_summary(metrics: dict, steps: int) -> str:
    """The validation numbers a journal entry quotes; τ (accept_len) over the `steps` trained draft
    positions, in the one τ format."""
    parts = [f"val {name} {metrics[name]:.4f}" for name in ("loss", "full_acc_0") if name in metrics]
    if "accept_len" in metrics:
        parts.append("val " + tau_text(metrics["accept_len"], steps, "held-out", digits=4))
    return ", ".join(parts)


def start_summary(cfg: RunConfig, resume_from: Path | None, remap_report: dict | None, total_steps: int,
                  step: int, tokens_seen: int) -> str:
    """The run-start journal entry: where it starts from and the settings that decide the outcome."""
    if resume_from is not None:
        head = f"resumed from {resume_from} at step {step} ({tokens_seen:,} tokens)"
    elif cfg.from_pretrained:
        head = f"started from pretrained {cfg.from_pretrained}"
        if remap_report and remap_report.get("remapped"):
            head += (f" (lm_head remapped: overlap {remap_report['overlap']}, positional matches "
                     f"{remap_report['positional_matches']})")
    else:
        head = "started from scratch"
    text = (f"{head}: store {cfg.store}, vocab {cfg.vocab}, model {cfg.model}; {cfg.epochs} epochs = "
            f"{total_steps} steps, lr {cfg.lr:g} ({cfg.schedule}, warm-up {cfg.warmup_steps}), TTT {cfg.ttt_steps}, "
            f"loss {cfg.loss}, TTT inputs {cfg.ttt_inputs}, aux_noise {cfg.aux_noise:g}, seed {cfg.seed}")
    options = [name for name in ("fc_norm", "norm_output", "norm_before_residual") if getattr(cfg, name)]
    if options or cfg.init_layer != "fresh":
        text += f"; drafter {', '.join(options + [f'layer from {cfg.init_layer}'])}"
    if cfg.baseline:
        text += (f"; watching baseline {cfg.baseline} ({cfg.watch_split} {cfg.watch_metric}, margin "
                 f"{cfg.watch_margin:g}{', stop if behind' if cfg.stop_if_behind else ''})")
    return text
