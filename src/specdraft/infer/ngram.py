"""Prompt-lookup (n-gram) drafting: find the latest earlier occurrence of the context's last n
tokens (n from ngram_max down to ngram_min) and propose what followed it. No model, no aux."""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from specdraft.errors import SpecdraftError
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import Profile
from specdraft.infer.tree import Draft


def lookup(tokens: list[int] | np.ndarray, k: int, ngram_max: int = 3, ngram_min: int = 1) -> list[int]:
    """Up to k tokens that followed the most recent earlier match of the longest matching suffix."""
    return lookup_match(tokens, k, ngram_max, ngram_min)[0]


def lookup_match(tokens: list[int] | np.ndarray, k: int, ngram_max: int = 3,
                 ngram_min: int = 1) -> tuple[list[int], int]:
    """lookup() and the length n of the suffix it matched (0: no match)."""
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(ngram_max, ngram_min - 1, -1):
        if len(arr) <= n:
            continue
        suffix = arr[-n:]
        windows = sliding_window_view(arr[:-1], n)              # starts 0..len-1-n: a continuation exists
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start:start + k].tolist(), n
    return [], 0


class NgramProposer:
    aux_layer_ids = None

    def __init__(self, k: int = 4, ngram_max: int = 3, ngram_min: int = 1):
        if not 1 <= ngram_min <= ngram_max:
            raise SpecdraftError(f"--ngram-min {ngram_min} / --ngram-max {ngram_max}: need 1 <= min <= max")
        self.k, self.ngram_max, self.ngram_min = k, ngram_max, ngram_min
        self.profile = Profile()

    @property
    def max_nodes(self) -> int:
        return self.k

    def reset(self) -> None:
        pass

    def observe(self, aux) -> None:
        pass

    def propose(self, tokens: list[int], budget: int, sampling: Sampling,
                generator: torch.Generator) -> Draft:
        with self.profile.timed("draft_s"):
            return Draft.chain(lookup(tokens, min(self.k, budget), self.ngram_max, self.ngram_min))
