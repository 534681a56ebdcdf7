"""The drafters' KV caches. Training-time test (TTT) uses transformers' `DynamicCache`: it grows by
concatenation, so the unroll backpropagates through it. Generation keeps specdraft.kvcache's
GrowingKVCache (transformers' DynamicLayer in preallocated buffers written in place, the one growing cache
regeneration uses too) and ContextCache (one GrowingKVCache per decoder layer: a block drafter's context). Both speak DynamicCache's
`update(k, v, layer_idx)`, so the drafter's attention takes either."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specdraft.kvcache import GrowingKVCache

__all__ = ["ContextCache", "DynamicCache", "GrowingKVCache"]


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
