"""Packed training batches from the hidden-state store.

Samples are packed into rows of `max_tokens` tokens; `doc_ids` (-1 on padding) keep packed samples
from attending to each other (model.drafter.causal_mask) and from being predicted across a
boundary, and `position_ids` restart at 0 in each sample. Everything is a pure function of
(sample lengths, seed, epoch), so a data position (epoch, batch index) is enough to resume exactly.

A global batch is `rows_per_batch * world_size` rows; rank r takes rows [r*rows_per_batch,
(r+1)*rows_per_batch) of it, so ranks never share a row. The last global batch of an epoch is
completed with empty (all padding) rows so that every rank takes the same number of steps.
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
        """This rank's batches of `epoch`, from batch index `start` (the saved data position)."""
        for b in range(start, self.num_batches(epoch)):
            yield self.collate(self.rank_rows(epoch, b))

    def collate(self, rows: list[list[int]]) -> dict[str, torch.Tensor]:
        """Rows of sample ids -> the packed batch dict of the training contract."""
        B, T, H = len(rows), self.max_tokens, self.store.hidden_size
        dtype = self.store.dtype
        batch = {"input_ids": torch.zeros(B, T, dtype=torch.long),
                 "aux": torch.zeros(B, T, 3, H, dtype=dtype),
                 "last": torch.zeros(B, T, H, dtype=dtype),
                 "loss_mask": torch.zeros(B, T, dtype=torch.uint8),
                 "doc_ids": torch.full((B, T), -1, dtype=torch.long),
                 "position_ids": torch.zeros(B, T, dtype=torch.long)}
        for r, samples in enumerate(rows):
            at = 0
            for doc, s in enumerate(samples):
                sample = self.store[s]
                n = min(sample["input_ids"].shape[0], T - at)
                for key in ("input_ids", "aux", "last", "loss_mask"):
                    batch[key][r, at:at + n] = sample[key][:n]
                batch["doc_ids"][r, at:at + n] = doc
                batch["position_ids"][r, at:at + n] = torch.arange(n)
                at += n
        return batch

    def tokens(self, epoch: int, batch_index: int) -> int:
        """Real (non-padding) tokens of this rank's part of a batch, without reading the store."""
        return sum(min(self.lengths[s], self.max_tokens) for row in self.rank_rows(epoch, batch_index)
                   for s in row)
