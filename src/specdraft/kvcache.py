"""The one growing KV cache: transformers' DynamicLayer with its keys/values in preallocated buffers written
in place (capacity doubles when full). DynamicLayer concatenates the whole cache at every update, which a
decode step pays for again and again (a batch of 64 rows copies far more cache than weights: SmolLM2 bf16 on
an AMX Xeon, 557 vs 496 tok/s, the same tokens); StaticCache cannot crop, which speculation needs.
Regeneration's DynamicCache takes it per full-attention layer (`growing_cache`); a drafter's generation takes
one per attention layer (`GrowingKVCache`, DynamicCache's `update(k, v, layer_idx)` and a crop that keeps the
first n positions). The target's verify runner keeps its own StaticLayer cache (infer/speculative.py, for
torch.compile's static shapes)."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256      # positions a new buffer holds at least


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views of buffers written in place."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        if self.buffers is not None and length and self.keys.data_ptr() != self.buffers[0].data_ptr():
            self.buffers = None          # keys replaced outside update (beam reorder): start new buffers
        need = length + key_states.shape[-2]
        if self.buffers is None or need > self.buffers[0].shape[-2]:
            capacity = max(need, MIN_CAPACITY, 2 * (self.buffers[0].shape[-2] if self.buffers is not None else 0))
            grown = tuple(x.new_empty(*x.shape[:-2], capacity, x.shape[-1]) for x in (key_states, value_states))
            if length:
                grown[0][..., :length, :], grown[1][..., :length, :] = self.keys, self.values
            self.buffers = grown
        self.buffers[0][..., length:need, :] = key_states
        self.buffers[1][..., length:need, :] = value_states
        self.keys, self.values = self.buffers[0][..., :need, :], self.buffers[1][..., :need, :]
        return self.keys, self.values


def growing_cache(config) -> DynamicCache:
    """A DynamicCache for `config` whose full-attention layers are GrowingLayers (sliding ones as they were)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class GrowingKVCache(GrowingLayer):
    """One attention layer's cache for a drafter's generation: `update(k, v, layer_idx)` as a DynamicCache
    takes it, `len()`, `key`/`value` (what it holds), and `crop(n)` keeping the first n positions."""

    def __len__(self) -> int:
        return self.get_seq_length()

    @property
    def key(self) -> torch.Tensor | None:
        return self.keys if self.is_initialized else None

    @property
    def value(self) -> torch.Tensor | None:
        return self.values if self.is_initialized else None

    def crop(self, n: int) -> None:
        if n < len(self):
            super().crop(-(len(self) - max(n, 0)))
