"""The drafters' KV caches: KVCache (grows by concatenation, so the TTT unroll can backpropagate
through it), GrowingKVCache (the generation loop's: preallocated buffers written in place, crop moves
the end) and ContextCache (one GrowingKVCache per decoder layer: a block drafter's context)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Keys/values seen so far: [B, kv_heads, S, head_dim]. `crop(n)` drops everything after n."""

    key: torch.Tensor | None = None
    value: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.key = k if self.key is None else torch.cat([self.key, k], dim=2)
        self.value = v if self.value is None else torch.cat([self.value, v], dim=2)
        return self.key, self.value

    def __len__(self) -> int:
        return 0 if self.key is None else self.key.shape[2]

    def crop(self, n: int) -> None:
        if self.key is not None:
            self.key, self.value = self.key[:, :, :n], self.value[:, :, :n]


class GrowingKVCache(KVCache):
    """The drafter's KVCache over preallocated buffers: append writes in place (capacity doubles when
    full) and crop moves the end, instead of a torch.cat of the whole cache at every draft step."""

    def __init__(self):
        super().__init__()
        self.length = 0
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
            cache.append(k, v)

    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(cache.key, cache.value) for cache in self.layers]

    def __len__(self) -> int:
        return len(self.layers[0])

    def crop(self, n: int) -> None:
        for cache in self.layers:
            cache.crop(n)
