"""Training on several processes with `torchrun`: process group, DDP or FSDP2, summed metrics.

    torchrun --nproc-per-node 2 -m specdraft.train --store WS/hidden ...       (or specdraft train --nproc 2)

`torchrun` starts the processes and sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR; this module
only turns that environment into a `train.runtime.Runtime`:

- the process group: NCCL when CUDA is there (one GPU per local rank), gloo on CPU;
- samples sharded by rank: each rank packs the same global batch and takes its own rows
  (train/batches.py, given `runtime.rank` / `runtime.world_size`);
- metric sums all-reduced (SUM), so every rank logs the global metrics;
- only rank 0 writes files (the loop checks `runtime.is_main`); ranks meet at `barrier` after
  each checkpoint;
- the TTT objective wrapped in DDP (default), or sharded with FSDP2 `fully_shard` for drafters of
  very wide targets (H = 7168: lm_head and optimizer state per rank shrink by the world size).
  Under FSDP2 every rank gathers the full weights and optimizer state to rank 0 for each
  checkpoint (checkpoint.full_training_state), which then writes the same files as a DDP or one-process
  run; on --resume every rank loads that checkpoint before sharding and hands the full optimizer
  state back (checkpoint.load_full_optimizer_state), so a run may change strategy between resumes.

Gradient averaging: DDP averages each rank's gradient, and each rank's loss is its own mean over
its trained positions, so the update equals the one-process update over the same global batch
when ranks hold equally many trained positions per TTT step (and is a per-rank-weighted mean
otherwise, the usual DDP behaviour).

No home-made launcher: `exec_torchrun` replaces the current process with `python -m
torch.distributed.run`.
"""

from __future__ import annotations

import gc
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from specdraft.errors import SpecdraftError
from specdraft.families import family_of
from specdraft.train.loop import train
from specdraft.train.runtime import Runtime, use_bf16

STRATEGIES = ("ddp", "fsdp")


# ----------------------------------------------------------------------------- environment

def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def is_main() -> bool:
    return rank() == 0


def pick_device(backend: str) -> torch.device:
    if backend == "nccl":
        if local_rank() >= torch.cuda.device_count():
            raise SpecdraftError(f"LOCAL_RANK {local_rank()}: only {torch.cuda.device_count()} CUDA devices here; "
                                 "pass --nproc-per-node at most the number of GPUs")
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def init(backend: str | None = None, timeout_s: float = 1800) -> tuple[str, torch.device]:
    """init_process_group from the torchrun environment; returns (backend, this rank's device)."""
    if not launched_by_torchrun():
        raise SpecdraftError("distributed training: RANK/WORLD_SIZE are not set; start with "
                             "`torchrun --nproc-per-node N -m specdraft.train ...` or `specdraft train --nproc N`")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend not in ("nccl", "gloo"):
        raise SpecdraftError(f"distributed backend {backend!r}: use nccl (GPU) or gloo (CPU)")
    device = pick_device(backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    return backend, device


def shutdown(wait_for_peers: bool = True) -> None:
    """Leave the process group. On the success path every rank first meets the others at a barrier
    (which also waits out its own pending gloo work): a rank that tears the group down while a peer
    still communicates makes gloo abort that peer ("terminate called without an active exception",
    seen at the end of 2-rank FSDP runs). Not on the error path, where a dead peer never arrives.
    Callers drop their model first and the collection below frees what reference cycles still hold
    (FSDP2 state and its gloo work): freed later, at interpreter exit, gloo's threads abort the rank."""
    if dist.is_initialized():
        gc.collect()
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- collectives

def all_reduce_sums(sums: dict[str, torch.Tensor] | None, device: torch.device | None = None) -> dict | None:
    """Sum every value of a metric-sums dict over all ranks (one all_reduce for the whole dict).

    Values are 0-dim tensors or numbers; returned as 0-dim float64 tensors on the CPU.
    """
    if sums is None or not dist.is_initialized() or dist.get_world_size() == 1:
        return sums
    keys = sorted(sums)                           # same order on every rank
    device = device or torch.device("cpu")
    flat = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64).reshape(()).to(device) for k in keys])  # [K]
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat = flat.cpu()
    return {k: flat[i] for i, k in enumerate(keys)}


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


# ----------------------------------------------------------------------------- wrapping

def wrap_ddp(model: torch.nn.Module, device: torch.device, find_unused_parameters: bool = False):
    """DDP over the whole TTT objective (drafter + teacher).

    Frozen parameters (embed_tokens, tied to the target) are skipped by DDP, and every trainable
    parameter takes part in every step, so find_unused_parameters stays off (it costs a graph walk
    per step). Buffers (d2t/t2d, rotary, the teacher head) are the same on every rank by
    construction, so they are not re-broadcast each forward (the teacher head alone is N x H).
    """
    from torch.nn.parallel import DistributedDataParallel

    model.to(device)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   forward_sync_buffers=False, find_unused_parameters=find_unused_parameters)


def wrap_fsdp(model: torch.nn.Module, device: torch.device, bf16: bool = False):
    """FSDP2 over the family's training objective: parameters become DTensors sharded on dim 0.

    The family names its wide submodules (Family.fsdp_units: embed_tokens, fc and lm_head); each is
    its own `fully_shard` unit, gathered only around its own calls. The objective is the root unit
    and gathers the rest for the step (the family's fsdp_units says why a layer stays there).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model.to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    for unit in family_of(model.drafter).fsdp_units(model.drafter):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def wrap(model: torch.nn.Module, strategy: str, device: torch.device, bf16: bool = False):
    if strategy == "ddp":
        return wrap_ddp(model, device)
    if strategy == "fsdp":
        return wrap_fsdp(model, device, bf16=bf16)
    raise SpecdraftError(f"--parallel {strategy}: use one of {', '.join(STRATEGIES)}")


# ----------------------------------------------------------------------------- entry points

def runtime(strategy: str = "ddp", backend: str | None = None, bf16=False):
    """Initialise the process group and return the loop's Runtime for this rank. `bf16` may be a
    function of the device (FSDP2 then gathers parameters in bf16)."""
    if strategy not in STRATEGIES:
        raise SpecdraftError(f"--parallel {strategy}: use one of {', '.join(STRATEGIES)}")
    _, device = init(backend)
    param_bf16 = bf16(device) if callable(bf16) else bool(bf16)
    return Runtime(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device,
                   reduce_sums=lambda sums: all_reduce_sums(sums, device),
                   wrap_model=lambda model: wrap(model, strategy, device, bf16=param_bf16),
                   barrier=barrier)


def run(cfg, strategy: str | None = None, setup=None) -> dict:
    """Train `cfg` as this torchrun rank; `setup(cfg, runtime)` may return extra train() arguments
    (online mode: data and target). Rank 0 writes the run folder; every rank returns the same summary."""
    strategy = strategy or getattr(cfg, "parallel", None) or os.environ.get("SPECDRAFT_PARALLEL", "ddp")
    rt = runtime(strategy, bf16=lambda device: use_bf16(cfg, device))
    if rt.is_main:
        print(f"{rt.world_size} ranks ({dist.get_backend()}), {strategy}", file=sys.stderr, flush=True)
    try:
        summary = train(cfg, runtime=rt, **(setup(cfg, rt) if setup is not None else {}))
    except BaseException:
        shutdown(wait_for_peers=False)
        raise
    shutdown()
    return summary


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run --nproc-per-node N -m specdraft.train ARGV`."""
    if nproc < 1:
        raise SpecdraftError(f"--nproc {nproc}: must be at least 1")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise SpecdraftError(f"--nproc {nproc}: only {torch.cuda.device_count()} GPUs here; use at most that many")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "specdraft.train", *argv]


def forward_cli_args(argv: list[str]) -> list[str]:
    """`specdraft train` arguments -> `python -m specdraft.train` arguments: drop --nproc N (the
    launcher's own option) and spell -m as --model; every other flag has the same name in both."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif arg.startswith("--nproc="):
            continue
        else:
            out.append("--model" if arg == "-m" else arg)
    return out


def exec_torchrun(nproc: int, argv: list[str]) -> None:
    """Replace this process with torchrun over `python -m specdraft.train ARGV` (never returns)."""
    cmd = torchrun_command(nproc, argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)
