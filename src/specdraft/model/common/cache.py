"""The drafters' KV caches. Training-time test (TTT) uses transformers' `DynamicCache`: it grows by
concatenation, so the unroll backpropagates through it. Generation keeps its own, because DynamicCache
concatenates the whole cache at every update (the cost the preallocated cache took out of each draft step)
and StaticCache cannot crop: GrowingKVCache (preallocated buffers written in place, crop moves the end) and
ContextCache (one GrowingKVCache per decoder layer: a block drafter's context). Both speak DynamicCache's
`update(k, v, layer_idx)`, so the drafter's attention takes either."""

from __future__ import annotations

import torch
from transformers import DynamicCache

__all__ = ["ContextCache", "DynamicCache", "GrowingKVCache"]


class GrowingKVCache:
    """Keys/values [B, kv_heads, S, head_dim] in preallocated buffers: update writes in place (capacity
    doubles when full); `crop(n)` drops everything after n."""

    def __init__(self):
        self.length = 0
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        need = self.length + k.shape[2]
        if self.buffers is None or need > self.buffers[0].shape[2]:
            capacity = max(need, 256, 2 * (self.buffers[0].shape[2] if self.buffers else 0))
            grown = tuple(x.new_empty(*x.shape[:2], capacity, x.shape[3]) for x in (k, v))
            if self.buffers is not None:
                for new, old in zip(grown, self.buffers):
                    new[:, :, :self.length] = old[:, :, :self.length]
            self.buffers = grown
        self.buffers[0][:, :, self.length:need] = k
        self.buffers[1][:, :, self.length:need] = v
        self.length = need
        self.key, self.value = (x[:, :, :need] for x in self.buffers)
        return self.key, self.value

    def __len__(self) -> int:
        return self.length

    def crop(self, n: int) -> None:
        if self.buffers is not None and n < self.length:
            self.length = max(n, 0)
            self.key, self.value = (x[:, :, :self.length] for x in self.buffers)


class ContextCache:
    """One GrowingKVCache per layer; crop(n) keeps the first n context positions of each."""

    def __init__(self, layers: int):
        self.layers = [GrowingKVCache() for _ in range(layers)]

    def append(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for cache, (k, v) in zip(self.layers, kv):
            cache.update(k, v)

    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(cache.key, cache.value) for cache in self.layers]

    def __len__(self) -> int:
        return len(self.layers[0])

    def crop(self, n: int) -> None:
        for cache in self.layers:
            cache.crop(n)
