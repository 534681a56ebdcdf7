"""Packed training batches from the hidden-state store.

Samples are packed into rows of `max_tokens` tokens; `doc_ids` (-1 on padding) keep packed samples
from attending to each other (model.drafter.causal_mask) and from being predicted across a
boundary, and `position_ids` restart at 0 in each sample. Everything is a pure function of
(sample lengths, seed, epoch), so a data position (epoch, batch index) is enough to resume exactly.

A global batch is `rows_per_batch * world_size` rows; rank r takes rows [r*rows_per_batch,
(r+1)*rows_per_batch) of it, so ranks never share a row. The last global batch of an epoch is
completed with empty (all padding) rows so that every rank takes the same number of steps.

Batches come out of a torch DataLoader whose batch sampler is that plan of rows: an item is one
packed row, so with `workers` > 0 the memory-mapped reads and the packing run in worker
processes while the GPU steps; the batches and their order are the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from specdraft.errors import SpecdraftError


def split_samples(num_samples: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train ids, val ids) by sample: the last val_fraction of a seeded permutation is held out."""
    if not 0 <= val_fraction < 1:
        raise SpecdraftError(f"--val-fraction {val_fraction}: must be in [0, 1)")
    perm = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = round(num_samples * val_fraction)
    if val_fraction > 0 and num_samples > 1:
        n_val = min(max(n_val, 1), num_samples - 1)
    if n_val == 0:
        return sorted(perm), []
    return sorted(perm[:-n_val]), sorted(perm[-n_val:])


def pack_rows(sample_ids: list[int], lengths: list[int], max_tokens: int, open_rows: int = 32) -> list[list[int]]:
    """First-fit packing in the given order (among the last `open_rows` rows): rows of sample ids
    whose lengths (capped at max_tokens) sum to at most max_tokens."""
    rows: list[list[int]] = []
    free: list[int] = []
    for s in sample_ids:
        n = min(lengths[s], max_tokens)
        for r in range(max(0, len(rows) - open_rows), len(rows)):
            if free[r] >= n:
                rows[r].append(s)
                free[r] -= n
                break
        else:
            rows.append([s])
            free.append(max_tokens - n)
    return rows


@dataclass
class StoreBatches:
    """Deterministic packed batches over a subset of a HiddenStore's samples (one rank's view)."""

    store: object                     # specdraft.data.store.HiddenStore
    sample_ids: list[int]
    max_tokens: int = 2048
    rows_per_batch: int = 1
    seed: int = 0
    shuffle: bool = True
    rank: int = 0
    world_size: int = 1
    workers: int = 0                  # DataLoader processes reading ahead (0: read in the loop's process)

    def __post_init__(self):
        if self.max_tokens < 4:
            raise SpecdraftError(f"--max-tokens {self.max_tokens}: too small to train on (use e.g. 2048)")
        if self.rows_per_batch < 1:
            raise SpecdraftError(f"--rows-per-batch {self.rows_per_batch}: must be at least 1")
        self.lengths = self.store.sample_lengths
        self._plans: dict[int, list[list[int]]] = {}

    def rows(self, epoch: int) -> list[list[int]]:
        """All packed rows of an epoch (every rank computes the same list)."""
        if epoch not in self._plans:
            order = list(self.sample_ids)
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
            self._plans = {epoch: pack_rows(order, self.lengths, self.max_tokens)}
        return self._plans[epoch]

    def num_batches(self, epoch: int) -> int:
        per_step = self.rows_per_batch * self.world_size
        return -(-len(self.rows(epoch)) // per_step)

    def rank_rows(self, epoch: int, batch_index: int) -> list[list[int]]:
        per_step = self.rows_per_batch * self.world_size
        rows = self.rows(epoch)[batch_index * per_step:(batch_index + 1) * per_step]
        mine = rows[self.rank * self.rows_per_batch:(self.rank + 1) * self.rows_per_batch]
        return mine + [[]] * (self.rows_per_batch - len(mine))

    def batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's batches of `epoch`, from batch index `start` (the saved data position): a
        DataLoader whose batch sampler is the packed rows, so with `workers` > 0 worker processes
        read the store ahead of the training step."""
        plan = [self.rank_rows(epoch, b) for b in range(start, self.num_batches(epoch))]
        # its own generator: a DataLoader otherwise draws its workers' base seed from the global
        # RNG, which would move the aux-noise draws of training (and break exact resume)
        loader = torch.utils.data.DataLoader(self, batch_sampler=plan, collate_fn=stack_rows,
                                             num_workers=self.workers, generator=torch.Generator())
        yield from loader

    def __getitem__(self, row: list[int]) -> dict[str, torch.Tensor]:
        """One packed row: its samples one after another, cut at max_tokens, padding after."""
        T, H, dtype = self.max_tokens, self.store.hidden_size, self.store.dtype
        K = getattr(self.store, "teacher_topk", 0)   # a compact store: the teacher's top-k instead of last
        teacher = ({"teacher_ids": torch.zeros(T, K, dtype=torch.int32),
                    "teacher_logp": torch.zeros(T, K, dtype=torch.float16)} if K else
                   {"last": torch.zeros(T, H, dtype=dtype)})
        packed = {"input_ids": torch.zeros(T, dtype=torch.long),
                  "aux": torch.zeros(T, len(self.store.layer_ids), H, dtype=dtype),
                  **teacher,
                  "loss_mask": torch.zeros(T, dtype=torch.uint8),
                  "doc_ids": torch.full((T,), -1, dtype=torch.long),
                  "position_ids": torch.zeros(T, dtype=torch.long)}
        at = 0
        for doc, s in enumerate(row):
            sample = self.store[s]
            n = min(sample["input_ids"].shape[0], T - at)
            for key in ("input_ids", "aux", *teacher, "loss_mask"):
                packed[key][at:at + n] = sample[key][:n]
            packed["doc_ids"][at:at + n] = doc
            packed["position_ids"][at:at + n] = torch.arange(n)
            at += n
        return packed


def stack_rows(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Packed rows ([T, ...] each) -> one batch ([B, T, ...]); the DataLoader's collate_fn."""
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}
