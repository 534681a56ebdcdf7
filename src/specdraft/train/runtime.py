"""What the loop runs on and reads from: a `Runtime` (rank, world size, device, how metric sums are
all-reduced, how the objective is wrapped) and a `TrainData` (where batches come from).

The defaults are one process; train/distributed.py fills in a Runtime for torchrun, and
train/online.py a TrainData whose batches the target computes. Kept apart from the loop so that
checkpoint.py, distributed.py and online.py can name these types without importing the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import torch

from specdraft.train.config import RunConfig


@dataclass
class Runtime:
    """One process by default; train/distributed.py fills in the rest."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    reduce_sums: Callable[[dict], dict] = lambda sums: sums          # all_reduce(SUM) of metric sums
    wrap_model: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m   # DDP / FSDP
    barrier: Callable[[], None] = lambda: None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def any_rank(runtime: Runtime, flag: bool) -> bool:
    """True on every rank when `flag` is True on any (one all_reduce; a no-op on one process)."""
    if runtime.world_size == 1:
        return bool(flag)
    return float(runtime.reduce_sums({"flag": torch.tensor(float(flag), dtype=torch.float64)})["flag"]) > 0


def replicated(value: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2's gradient norm is one) as the same plain tensor on every rank (collective);
    a plain tensor unchanged."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def use_bf16(cfg: RunConfig, device: torch.device) -> bool:
    """bf16 autocast where the hardware does it natively; without AVX512-BF16/AMX a CPU runs bf16
    matmuls an order of magnitude slower than fp32."""
    if cfg.precision != "auto":
        return cfg.precision == "bf16"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class Batches(Protocol):
    def num_batches(self, epoch: int) -> int: ...
    def batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, torch.Tensor]]: ...


@dataclass
class TrainData:
    """Where batches come from: this rank's train and validation batches, and what produced them."""

    train: Batches
    val: Batches | None
    hidden_size: int
    layer_ids: list[int]
    target: dict                        # identity of the target the hidden states came from
    source: str = ""                    # for messages (the store path)
    identity: dict = field(default_factory=dict)   # what checkpoints record of the data (data_identity)
