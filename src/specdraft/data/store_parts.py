"""Training on a store captured in parts: `capture --part I/N` on N nodes, then `train --store A
--store B ...`. The parts must be of one capture (target, aux layers, format...); their samples are
put back in the whole set's order (part I's sample j is sample (I-1) + j*N), so a run on the
parts sees exactly the samples, split and batches of a run on one store of the same data.

Stores that are not parts of one capture may share samples (two captures of overlapping prepared
data): a sample whose tokens equal an earlier one's is dropped with one warning line per store, so
every sample is trained once and no validation sample has an exact copy in training. A store of the
same samples as another (equal data fingerprint: passed twice, a copy) is refused."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from specdraft.data import store_formats as sf
from specdraft.data.store import MANIFEST, HiddenStore
from specdraft.errors import SpecdraftError

# what every part must share: (field as the error names it, how to read it from a manifest)
AGREE = (("target.fingerprint", lambda m: m["target"].get("fingerprint", "")),
         ("layer_ids", lambda m: list(m["layer_ids"])),
         ("store_format", sf.manifest_format),
         ("hidden_size", lambda m: m["hidden_size"]),
         ("dtype", lambda m: m["dtype"]),
         ("teacher_topk", lambda m: m.get("teacher_topk")),
         ("part count", lambda m: (m.get("part") or [None, None])[1]))


def check_parts_agree(parts: list[HiddenStore]) -> None:
    """Each part against the first, field by field; one line naming the part, the field and both values."""
    first = parts[0]
    for k, store in enumerate(parts[1:], start=2):
        for field, read in AGREE:
            have, want = read(store.manifest), read(first.manifest)
            if have != want:
                raise SpecdraftError(f"{store.root / MANIFEST}: --store part {k} of {len(parts)} has {field} "
                                     f"{json.dumps(have)} but part 1 ({first.root}) has {json.dumps(want)}; train "
                                     "on parts of one capture (same --model, --layers, --store-format, --part I/N)")
    seen: dict[int, Path] = {}
    for store in parts:
        index = (store.manifest.get("part") or [None])[0]
        if index is not None and index in seen:
            raise SpecdraftError(f"{store.root / MANIFEST}: field 'part' says {index}/{store.manifest['part'][1]}, "
                                 f"the same part as {seen[index]}; pass each part once")
        seen[index] = store.root
    same_data: dict[str, Path] = {}
    for store in parts:   # a store given twice, or a copy of it: every sample twice, val samples in training
        fp = str((store.manifest.get("data") or {}).get("fingerprint") or "")
        if fp and fp in same_data:
            raise SpecdraftError(f"{store.root / MANIFEST}: field 'data.fingerprint' {fp} is that of "
                                 f"{same_data[fp]}: the same samples twice (a store passed twice, or a copy); "
                                 "pass each store once")
        same_data[fp] = store.root


def sample_order(parts: list[HiddenStore]) -> list[tuple[int, int]]:
    """(part, sample in part) for every sample, in the whole set's order when the parts come from
    --part I/N (any subset of them, any order on the command line), else part after part."""
    records = [store.manifest.get("part") for store in parts]
    if not all(records):
        return [(k, i) for k, store in enumerate(parts) for i in range(len(store))]
    whole = sorted((index - 1 + i * count, k, i) for k, (index, count) in enumerate(records)
                   for i in range(len(parts[k])))
    return [(k, i) for _, k, i in whole]


def sample_keys(store: HiddenStore) -> list[bytes]:
    """A digest of each sample's tokens, in store order (reads the input_ids, not the hidden states)."""
    keys = []
    for k in range(len(store.shards)):
        ids, off = store._handle(k).get_tensor("input_ids").numpy(), store._shard_offsets(k)
        keys += [hashlib.sha256(ids[a:b].tobytes()).digest() for a, b in zip(off[:-1], off[1:])]
    return keys


def without_copies(parts: list[HiddenStore], order: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`order` less every sample whose tokens equal an earlier sample's (in another store), with one
    warning line per store that had such copies."""
    keys = [sample_keys(store) for store in parts]
    first: dict[bytes, int] = {}
    kept, dropped = [], {}
    for k, i in order:
        owner = first.setdefault(keys[k][i], k)
        if owner == k:
            kept.append((k, i))
        else:
            dropped.setdefault(k, {}).setdefault(owner, 0)
            dropped[k][owner] += 1
    for k, owners in dropped.items():
        also = ", ".join(f"{n} in --store {parts[o].root}" for o, n in owners.items())
        print(f"warning: --store {parts[k].root}: {sum(owners.values())} of its {len(parts[k])} samples have the "
              f"same tokens as samples of another store ({also}); each is trained on once, so no validation "
              "sample has a copy in training", file=sys.stderr)
    return kept


class StoreParts:
    """Several HiddenStores read as one (the interface StoreBatches and train/inputs.py use)."""

    def __init__(self, paths: list[str | Path], verify: bool = False):
        self.parts = [HiddenStore(p, verify=verify) for p in paths]
        check_parts_agree(self.parts)
        self.order = sample_order(self.parts)
        if not all(p.manifest.get("part") for p in self.parts):   # parts of one capture are disjoint by index
            self.order = without_copies(self.parts, self.order)
        first = self.parts[0]
        fingerprints = "|".join(str((p.manifest.get("data") or {}).get("fingerprint", "")) for p in self.parts)
        self.manifest = {**first.manifest, "num_samples": len(self.order), "num_tokens": self.num_tokens,
                         "data": {"fingerprint": hashlib.sha256(fingerprints.encode()).hexdigest()[:32],
                                  "parts": [str(p.root) for p in self.parts]}}

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int):
        k, j = self.order[i]
        return self.parts[k][j]

    @property
    def sample_lengths(self) -> list[int]:
        lengths = [p.sample_lengths for p in self.parts]
        return [lengths[k][j] for k, j in self.order]

    @property
    def num_tokens(self) -> int:
        return sum(self.sample_lengths)

    # the same in every part (check_parts_agree)
    hidden_size = property(lambda self: self.parts[0].hidden_size)
    layer_ids = property(lambda self: self.parts[0].layer_ids)
    target = property(lambda self: self.parts[0].target)
    dtype = property(lambda self: self.parts[0].dtype)
    store_format = property(lambda self: self.parts[0].store_format)
    teacher_topk = property(lambda self: self.parts[0].teacher_topk)


def open_stores(paths: list[str | Path], verify: bool = False):
    """One store as a HiddenStore, several as StoreParts."""
    return HiddenStore(paths[0], verify=verify) if len(paths) == 1 else StoreParts(paths, verify=verify)
