"""Prompt-lookup (n-gram) drafting: find the latest earlier occurrence of the context's last n
tokens (n from ngram_max down to ngram_min) and propose what followed it. No model, no aux.

With a datastore (`--datastore WS/data`: the target's own answers from prepared data), a context
without a match of DATASTORE_AFTER tokens or more drafts the continuation the target wrote most often
after its last 2-4 tokens in those answers (the idea of REST and suffix decoding, kept as a table).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

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


def assistant_spans(mask) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s in a loss mask: each assistant turn."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], np.asarray(mask, dtype=np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


DATASTORE_AFTER = 2   # a context match this long or longer wins over the datastore (answers repeat their context)


class Datastore:
    """The continuation the target wrote most often after each 2-4 token sequence of its answers.
    Ours, not a suffix tree library's: a dict of n-grams is all a lookup of at most 4 tokens needs."""

    def __init__(self, answers: list[list[int]], ngram_max: int = 4, ngram_min: int = 2):
        self.answers, self.ngram_max, self.ngram_min = answers, ngram_max, ngram_min
        self.depth, self.continuations = 0, {}        # n-gram -> its most frequent `depth`-token continuation

    @classmethod
    def from_prepared(cls, path: str | Path, target=None) -> "Datastore":
        """Every assistant turn (a run of the loss mask) of `specdraft prepare`'s data."""
        from specdraft.data.prepared import check_prepared_for, load_prepared

        ds, meta = load_prepared(path)
        if target is not None:
            check_prepared_for(meta, target, path, "pass --datastore data prepared")
        answers = [list(ids[a:b]) for ids, mask in zip(ds["input_ids"], ds["loss_mask"])
                   for a, b in assistant_spans(mask)]
        if not answers:
            raise SpecdraftError(f"--datastore {path}: no assistant tokens in its loss mask; pass data prepared "
                                 "with answers (WS/data after prepare --regenerate)")
        vocab = getattr(target, "vocab_size", None)
        bad = next(((i, t) for i, ans in enumerate(answers) for t in ans if not 0 <= t < (vocab or t + 1)), None)
        if bad is not None:     # a drafted id past the vocabulary would reach the verify forward
            raise SpecdraftError(f"--datastore {path}: answer {bad[0]} holds token id {bad[1]}, outside {target.name}'s "
                                 f"vocabulary (0..{vocab - 1}); re-run `specdraft prepare` for this target")
        return cls(answers)

    def describe(self, path) -> dict:
        """What bench.json records of it."""
        return {"path": str(path), "answers": len(self.answers), "tokens": sum(map(len, self.answers))}

    def table(self, k: int) -> dict[tuple, tuple]:
        """n-gram -> its most frequent k-token continuation (k or more: lookup cuts it), built once
        for the longest k asked; proposers ask at construction, so no round pays for it."""
        if k > self.depth:
            counts: dict[tuple, Counter] = defaultdict(Counter)
            for seq in self.answers:
                for i in range(self.ngram_min, len(seq)):
                    for n in range(self.ngram_min, min(self.ngram_max, i) + 1):
                        counts[tuple(seq[i - n:i])][tuple(seq[i:i + k])] += 1
            self.depth, self.continuations = k, {key: c.most_common(1)[0][0] for key, c in counts.items()}
        return self.continuations

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        table = self.table(k)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if len(tokens) >= n and (found := table.get(tuple(tokens[-n:]))):
                return list(found[:k])
        return []


def draft_tokens(tokens: list[int], k: int, ngram_max: int, ngram_min: int,
                 datastore: Datastore | None = None) -> tuple[list[int], int]:
    """(draft, matched length): the context's own match, else the datastore's (matched length
    DATASTORE_AFTER), else a shorter context match."""
    found, n = lookup_match(tokens, k, ngram_max, ngram_min)
    if datastore is None or n >= DATASTORE_AFTER or k < 1:
        return found, n
    stored = datastore.lookup(tokens, k)
    return (stored, DATASTORE_AFTER) if stored else (found, n)


class NgramProposer:
    aux_layer_ids = None

    def __init__(self, k: int = 4, ngram_max: int = 3, ngram_min: int = 1, datastore: Datastore | None = None):
        if not 1 <= ngram_min <= ngram_max:
            raise SpecdraftError(f"--ngram-min {ngram_min} / --ngram-max {ngram_max}: need 1 <= min <= max")
        self.k, self.ngram_max, self.ngram_min, self.datastore = k, ngram_max, ngram_min, datastore
        self.profile = Profile()
        if datastore is not None:
            datastore.table(k)

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
            return Draft.chain(draft_tokens(tokens, min(self.k, budget), self.ngram_max, self.ngram_min,
                                            self.datastore)[0])
