"""Training checkpoints: a drafter folder in the speculators layout (servable as is) plus
trainer_state.pt (optimizer, scheduler, RNG states, data position, counters) written inside the
same atomic folder swap, so a checkpoint is either wholly there or the previous one is.

    RUN/checkpoints/epoch-N/   after each epoch (all kept)
    RUN/checkpoints/step-S/    every save_every steps (the last keep_step_checkpoints kept)
    RUN/best/                  lowest validation loss so far (weights + val.json)

trainer_state.pt holds only tensors and plain containers: it is loaded with weights_only=True.
The files are the same whether the drafter trained in one process, under DDP or sharded with
FSDP2: `training_state` gathers sharded weights and optimizer state into the one-process form,
and `load_optimizer_state` shards it back on resume (torch.distributed.checkpoint's state_dict
helpers). Not accelerate's save_state: it needs an Accelerator that owns the model, optimizer and
data, writes its own files (RNG states as random_states_N.pkl, read back with weights_only=False)
beside ours, and keeps no data position; the RNG state here is two lines.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from specdraft import run_layout
from specdraft.errors import SpecdraftError
from specdraft.formats.checkpoints import save_checkpoint

STATE_FILE = "trainer_state.pt"
PROGRESS_FILE = "progress.json"      # {step, epoch, batch, tokens_seen}: readable without torch.load


def drafter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in model.state_dict().items() if not k.startswith("rotary_emb")}


def training_state(drafter: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> tuple[dict, dict | None]:
    """(drafter tensors, optimizer state dict) as a checkpoint stores them.

    A plain (or DDP-trained) drafter gives its own tensors and `optimizer.state_dict()`. A drafter
    sharded with FSDP2 gives the gathered full ones in the same form; that is a collective: every
    rank calls it, and the result is complete on rank 0 only (the one that writes)."""
    if is_sharded(drafter):
        return full_training_state(drafter, optimizer)
    return drafter_tensors(drafter), (optimizer.state_dict() if optimizer is not None else None)


def load_optimizer_state(drafter: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Set a checkpoint's optimizer state (one-process form) back; under FSDP2 every rank passes
    the full state and keeps its own shard."""
    if is_sharded(drafter):
        load_full_optimizer_state(drafter, optimizer, saved)
    else:
        optimizer.load_state_dict(saved)


# ----------------------------------------------------------------------------- FSDP2: full state from shards

def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective (call on every rank): the full, unsharded state dict of an FSDP2 (or plain)
    module, on the CPU, complete on rank 0 (other ranks get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options())


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def is_sharded(module: torch.nn.Module) -> bool:
    """True when `module` holds FSDP2-sharded parameters (DTensors)."""
    if not dist.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def _trained_names(drafter: torch.nn.Module) -> list[str]:
    """Names of the parameters the loop's optimizer holds, in its order (index i = parameter i)."""
    return [name for name, p in drafter.named_parameters() if p.requires_grad]


def full_training_state(drafter: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None):
    """Collective: (drafter tensors, optimizer state) of an FSDP2-sharded drafter, gathered on the
    CPU in the form one process saves (checkpoint.drafter_tensors / optimizer.state_dict(): state
    keyed by parameter index). Complete on rank 0; other ranks get empty dicts."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    tensors = {k: v.contiguous() for k, v in full_state_dict(drafter).items() if not k.startswith("rotary_emb")}
    if optimizer is None:
        return tensors, None
    by_name = get_optimizer_state_dict(drafter, optimizer, options=_full_options())
    if not by_name:
        return tensors, {}
    index = {name: i for i, name in enumerate(_trained_names(drafter))}
    state = {index[name]: value for name, value in by_name["state"].items()}
    groups = [{**group, "params": [index[name] for name in group["params"]]} for group in by_name["param_groups"]]
    return tensors, {"state": dict(sorted(state.items())), "param_groups": groups}


def load_full_optimizer_state(drafter: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Collective: set a full optimizer state (one-process form, as `full_training_state` or a
    DDP run saved it) into the optimizer of an FSDP2-sharded drafter; each rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _trained_names(drafter)
    by_name = {"state": {names[i]: value for i, value in saved["state"].items()},
               "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                                for group in saved["param_groups"]]}
    set_optimizer_state_dict(drafter, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


# ----------------------------------------------------------------------------- files

def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def save(folder: str | Path, model: torch.nn.Module, trainer_state: dict | None = None,
         extra_json: dict[str, dict] | None = None, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Drafter weights + config.json (+ trainer_state.pt, + small json files), atomically.
    `tensors` (from `training_state`) replace the model's own, e.g. when its weights are sharded."""
    extra = {}
    if trainer_state is not None:
        extra[STATE_FILE] = lambda path: torch.save(trainer_state, path)
    for name, obj in (extra_json or {}).items():
        extra[name] = lambda path, obj=obj: path.write_text(json.dumps(obj, indent=2) + "\n")
    tensors = tensors if tensors is not None else drafter_tensors(model)
    return save_checkpoint(folder, tensors, model.config, extra_files=extra)


def load_trainer_state(folder: str | Path) -> dict:
    path = Path(folder) / STATE_FILE
    if not path.is_file():
        raise SpecdraftError(f"{path}: not found; {folder} is not a training checkpoint (cannot resume from it)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise SpecdraftError(f"{path}: unreadable trainer state ({str(e).splitlines()[0]}); "
                             "resume from an earlier checkpoint") from None


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, str, Path]]:
    """(step, kind, folder) of every finished checkpoint in RUN/checkpoints, oldest first."""
    found = [(checkpoint_step(folder), kind, folder)
             for kind, _, folder in run_layout.checkpoints(run_dir, holding=(STATE_FILE, "config.json"))]
    # at equal steps prefer the epoch checkpoint (it also holds that epoch's validation)
    return sorted(found, key=lambda x: (x[0], x[1] == "epoch"))


def checkpoint_step(folder: Path) -> int:
    """The step of a checkpoint, from its progress.json. Checkpoints are written whole (a temp
    sibling swapped in), so one without a readable progress.json was damaged afterwards: refused,
    never skipped (resuming an older checkpoint in its place would repeat steps silently)."""
    path = folder / PROGRESS_FILE
    fix = f"delete {folder} to resume from the checkpoint before it"
    if not path.is_file():
        raise SpecdraftError(f"{path}: not found; the checkpoint is damaged; {fix}")
    try:
        step = json.loads(path.read_text()).get("step")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        step = None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise SpecdraftError(f"{path}: no whole-number step (damaged or edited); {fix}")
    return step


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][2] if found else None


def prune_step_checkpoints(run_dir: str | Path, keep: int) -> None:
    steps = [c for c in list_checkpoints(run_dir) if c[1] == "step"]
    for _, _, folder in steps[:max(0, len(steps) - keep)]:
        shutil.rmtree(folder, ignore_errors=True)
