"""The draft vocabulary: which target tokens the drafter's lm_head can propose.

Convention (speculators, SpecForge, SGLang and vLLM; keep it byte-exact):
    d2t  int64 [draft_vocab]   OFFSETS: target_id = draft_id + d2t[draft_id]
    t2d  bool  [target_vocab]  True for exactly draft_vocab target ids
    draft ids follow ascending target id.

Build: count target tokens where loss_mask == 1, take the top N (ties by lower id), pad with
the lowest unused ids when fewer distinct tokens exist, sort ascending.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdraft.data.prepared import load_prepared
from specdraft.data.store import read_manifest, safe_shard_path
from specdraft.errors import SpecdraftError
from specdraft.io import atomic_path, check_model, read_json
from specdraft.schemas.drafter import read_drafter_config
from specdraft.schemas.vocab import COUNTS, VocabHeader
from specdraft.targets import info, load_tokenizer
from specdraft.weights import index_weight_map, read_weights

FORMAT_VERSION = 1
CONVENTION = "d2t must hold offsets target_id = draft_id + d2t[draft_id]"
ABSOLUTE_IDS = f"d2t holds absolute target ids; {CONVENTION} (convert with d2t - arange(len(d2t)))"


@dataclass
class Vocab:
    d2t: torch.Tensor            # int64 [draft_vocab], offsets
    t2d: torch.Tensor            # bool [target_vocab]
    meta: dict = field(default_factory=dict)

    @property
    def draft_vocab_size(self) -> int:
        return int(self.d2t.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.t2d.numel())

    @property
    def draft_to_target(self) -> torch.Tensor:
        """Absolute target id of each draft row, int64 [draft_vocab]."""
        return torch.arange(self.d2t.numel(), dtype=torch.long) + self.d2t


# ----------------------------------------------------------------------------- build

def mapping_from_counts(counts: np.ndarray, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-`size` ids by count (ties by lower id; zero-count ids come last in id order, which is
    exactly "pad with the lowest unused ids"), sorted ascending -> (d2t offsets, t2d mask)."""
    vocab_size = int(counts.shape[0])
    if size > vocab_size:
        raise SpecdraftError(f"--size {size}: larger than the target vocabulary ({vocab_size} tokens); "
                             f"choose --size <= {vocab_size}")
    if size < 1:
        raise SpecdraftError(f"--size {size}: the draft vocabulary needs at least one token")
    ids = np.arange(vocab_size)
    order = np.lexsort((ids, -counts.astype(np.int64)))  # primary: count desc, then id asc
    chosen = np.sort(order[:size])                        # [size] ascending target ids
    d2t = torch.from_numpy(chosen - np.arange(size)).to(torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.from_numpy(chosen)] = True
    return d2t, t2d


def count_tokens(input_ids: np.ndarray, loss_mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """Occurrences of each target id at loss-masked positions, int64 [vocab_size]."""
    ids = np.asarray(input_ids).astype(np.int64)[np.asarray(loss_mask).astype(bool)]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise SpecdraftError(f"token id {int(ids.max())} out of range for a target vocabulary of {vocab_size}; "
                             "the data was prepared for another target (pass the right --model)")
    return np.bincount(ids, minlength=vocab_size).astype(np.int64)


def _flat_columns_prepared(ds) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and loss_mask of every sample, concatenated, straight from Arrow (no Python loop)."""
    import pyarrow.compute as pc

    if getattr(ds, "_indices", None) is not None:
        ds = ds.flatten_indices()
    ids = pc.list_flatten(ds.data.column("input_ids")).to_numpy()
    mask = pc.list_flatten(ds.data.column("loss_mask")).to_numpy()
    if ids.shape != mask.shape:
        raise SpecdraftError("prepared data: input_ids and loss_mask lengths differ; re-run `specdraft prepare`")
    return ids, mask


def _load_token_counts_source(data: Path):
    """(input_ids, loss_mask, meta) from a prepared folder or a hidden-state store."""
    data = Path(data)
    if data.is_dir() and (data / "manifest.json").exists():
        from safetensors import safe_open

        manifest = read_json(data / "manifest.json", "hidden-store manifest")
        shards = manifest.get("shards") if isinstance(manifest, dict) else None
        if not isinstance(shards, list) or not all(isinstance(e, dict) for e in shards):
            raise SpecdraftError(f"{data / 'manifest.json'}: field 'shards' must be a list of shard entries; "
                                 "re-capture into an empty --out")
        ids, masks = [], []
        for entry in shards:   # entries stay inside the store
            with safe_open(str(safe_shard_path(data, entry.get("file"))), framework="np") as f:
                ids.append(f.get_tensor("input_ids").reshape(-1))
                masks.append(f.get_tensor("loss_mask").reshape(-1))
        if not ids:
            raise SpecdraftError(f"{data}: hidden store has no shards yet; run `specdraft capture`")
        return np.concatenate(ids), np.concatenate(masks), manifest

    ds, meta = load_prepared(data)
    ids, mask = _flat_columns_prepared(ds)
    return ids, mask, meta


def _counted_together(folders: list[Path]) -> tuple[np.ndarray, np.ndarray, dict]:
    """(input_ids, loss_mask, the first folder's meta) over every folder, all of one target."""
    from specdraft.targets import same_target

    loaded = [_load_token_counts_source(f) for f in folders]
    first = loaded[0][2].get("target") or {}
    for folder, (_, _, meta) in zip(folders[1:], loaded[1:]):
        other = meta.get("target") or {}
        # by fingerprint where both record one (two models saved under one folder name share an id), else by id
        both = other.get("fingerprint") and first.get("fingerprint")
        same = same_target(other.get("fingerprint"), first) or same_target(first.get("fingerprint"), other) \
            if both else other.get("id") == first.get("id")
        if not same:
            raise SpecdraftError(f"{folder}: holds the tokens of {other.get('id')} (fingerprint {other.get('fingerprint')}), "
                                 f"but {folders[0]} holds {first.get('id')}'s (fingerprint {first.get('fingerprint')}); "
                                 "a draft vocab counts one target's tokens: pass stores of the same target")
    return (np.concatenate([x[0] for x in loaded]), np.concatenate([x[1] for x in loaded]), loaded[0][2])


def build_from_data(data: str | Path | list, size: int, out: str | Path, model: str | None = None,
                    kind: str | None = None) -> dict:
    """Build the top-`size` draft vocab over loss-masked tokens of `data` (a folder, or a list of stores
    counted together) and write `out`. `kind` ("prepared" or "store", as the command line named it;
    None: either) is checked against each folder."""
    folders = [Path(d) for d in (data if isinstance(data, (list, tuple)) else [data])]
    for folder in folders:
        if kind == "store":
            read_manifest(folder)        # a prepared folder or an unfinished store: says which
        elif kind == "prepared" and (folder / "manifest.json").exists():
            raise SpecdraftError(f"{folder}: a hidden-state store (from `specdraft capture`), not prepared data; "
                                 f"pass it as --store {folder}, or --prepared WS/data")
    data = folders[0]
    ids, mask, meta = _counted_together(folders)
    target = dict(meta.get("target") or {})
    if model is not None:
        tinfo = info(model)
        target = {"id": tinfo["id"], "vocab_size": tinfo["vocab_size"],
                  "fingerprint": target.get("fingerprint", "") if target.get("id") == tinfo["id"] else ""}
    vocab_size = target.get("vocab_size")
    if not vocab_size:
        raise SpecdraftError(f"{data}: the target's vocab size is not recorded; pass --model TARGET")
    vocab_size = int(vocab_size)
    if size > vocab_size:
        raise SpecdraftError(f"--size {size}: larger than the target vocabulary ({vocab_size} tokens); "
                             f"choose --size <= {vocab_size}")
    counts = count_tokens(ids, mask, vocab_size)
    d2t, t2d = mapping_from_counts(counts, size)
    total = int(counts.sum())
    covered = int(counts[t2d.numpy()].sum())
    summary = {"draft_vocab_size": int(size), "target_vocab_size": vocab_size,
               "coverage": covered / total if total else 0.0,
               "distinct_tokens": int((counts > 0).sum()), "loss_tokens": total}
    vocab_meta = {"target_id": str(target.get("id", "")), "fingerprint": str(target.get("fingerprint", "")),
                  "coverage": round(summary["coverage"], 6), "distinct_tokens": summary["distinct_tokens"]}
    if model is not None:
        vocab_meta["tokenizer"] = tokenizer_fingerprint(load_tokenizer(model))
    save(Vocab(d2t, t2d, vocab_meta), out)
    return summary


def build_summary_lines(summary: dict, out) -> list[str]:
    """What `specdraft vocab build` prints. Coverage is of the tokens counted: from fewer distinct
    tokens than --size, 100% says the data is small, not that the vocab fits the target's use."""
    lines = [f"vocab {summary['draft_vocab_size']} of {summary['target_vocab_size']} tokens, covers "
             f"{summary['coverage']:.1%} of trained tokens -> {out}"]
    distinct = summary.get("distinct_tokens")
    if isinstance(distinct, int) and distinct < summary["draft_vocab_size"]:
        lines.append(f"warning: the data holds only {distinct} distinct trained tokens for --size "
                     f"{summary['draft_vocab_size']}: the other {summary['draft_vocab_size'] - distinct} entries "
                     "are filler, and the coverage is measured on this small data only; prepare more samples")
    return lines


# ----------------------------------------------------------------------------- file I/O

def save(vocab: Vocab, out: str | Path) -> None:
    """Write vocab.safetensors: tensors d2t, t2d; the json header in ONE metadata key "specdraft"
    (safetensors writes several keys in hash order, so equal vocabs would differ byte-wise)."""
    from safetensors.torch import save_file

    check_mapping(vocab.d2t, vocab.t2d, str(out))
    header = {k: v for k, v in vocab.meta.items() if k != "source"}
    header.update({"format": "specdraft-vocab", "format_version": FORMAT_VERSION,
                   "target_vocab_size": vocab.target_vocab_size, "draft_vocab_size": vocab.draft_vocab_size})
    with atomic_path(out) as tmp:
        save_file({"d2t": vocab.d2t.to(torch.long).contiguous(), "t2d": vocab.t2d.to(torch.bool).contiguous()},
                  str(tmp), metadata={"specdraft": json.dumps(header, sort_keys=True)})


def check_mapping(d2t: torch.Tensor, t2d: torch.Tensor | None, where: str,
                  target_vocab_size: int | None = None) -> None:
    """Fail with one line unless d2t/t2d follow the offsets convention and agree with each other."""
    d2t = integer_d2t(d2t, where)
    if d2t.dim() != 1:
        raise SpecdraftError(f"{where}: d2t must be a 1-D integer tensor, got {tuple(d2t.shape)} {d2t.dtype}")
    n = d2t.numel()
    if n == 0:
        raise SpecdraftError(f"{where}: d2t has 0 rows (an empty draft vocab); rebuild it with "
                             "`specdraft vocab build --size N` (N >= 1)")
    targets = torch.arange(n, dtype=torch.long) + d2t
    vsize = t2d.numel() if t2d is not None else target_vocab_size
    if t2d is not None:
        if t2d.dim() != 1:
            raise SpecdraftError(f"{where}: t2d must be 1-D [target_vocab], got {tuple(t2d.shape)}")
        if t2d.dtype != torch.bool:
            if not bool(((t2d == 0) | (t2d == 1)).all()):
                raise SpecdraftError(f"{where}: t2d must be a bool mask over the target vocab (True on draft "
                                     "tokens), got other values")
            t2d = t2d.bool()
        true_ids = torch.nonzero(t2d).flatten()
        if true_ids.numel() != n:
            raise SpecdraftError(f"{where}: t2d has {true_ids.numel()} True entries but d2t has {n} rows; "
                                 "they must agree (exactly draft_vocab True entries)")
        if not torch.equal(targets, true_ids):
            if torch.equal(d2t, true_ids):
                raise SpecdraftError(f"{where}: {ABSOLUTE_IDS}")
            raise SpecdraftError(f"{where}: d2t and t2d disagree ({CONVENTION}, draft ids ascending by "
                                 "target id, t2d True exactly on those targets)")
        return
    # no t2d: check offsets alone
    if n and vsize is not None and int(targets.max()) >= vsize and int(d2t.max()) < vsize \
            and bool((d2t[1:] > d2t[:-1]).all()):
        raise SpecdraftError(f"{where}: {ABSOLUTE_IDS}")
    if n > 1 and not bool((targets[1:] > targets[:-1]).all()):
        raise SpecdraftError(f"{where}: draft ids must follow ascending target ids ({CONVENTION})")
    if n and (int(targets.min()) < 0 or (vsize is not None and int(targets.max()) >= vsize)):
        raise SpecdraftError(f"{where}: d2t maps outside the target vocabulary ({CONVENTION})")


def integer_d2t(d2t: torch.Tensor, where: str, fix: str = "rebuild it with `specdraft vocab build`") -> torch.Tensor:
    """d2t as int64; a float d2t is refused before any cast, since rounding it would silently turn
    offsets into other token ids."""
    if d2t.dtype not in (torch.int64, torch.int32):
        raise SpecdraftError(f"{where}: d2t is {str(d2t.dtype).removeprefix('torch.')} but must be an integer "
                             f"tensor (int64 offsets; {CONVENTION}); {fix}")
    return d2t.to(torch.long)


def t2d_from_d2t(d2t: torch.Tensor, target_vocab_size: int) -> torch.Tensor:
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[torch.arange(d2t.numel()) + d2t.to(torch.long)] = True
    return t2d


def _read_tensors(path: Path, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Only `names` from a drafter's weights (model.safetensors, sharded index, or pytorch_model.bin)."""
    from safetensors import safe_open

    if (path / "model.safetensors").exists():
        files = {n: path / "model.safetensors" for n in names}
    elif (path / "model.safetensors.index.json").exists():
        wmap = index_weight_map(path / "model.safetensors.index.json")
        files = {n: path / wmap[n] for n in names if n in wmap}
    elif (path / "pytorch_model.bin").exists():
        sd = read_weights(path)
        return {n: sd[n] for n in names if n in sd}
    else:
        raise SpecdraftError(f"{path}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
    out = {}
    for n, f in files.items():
        with safe_open(str(f), framework="pt") as sf:
            if n in sf.keys():
                out[n] = sf.get_tensor(n)
    return out


def load(path: str | Path) -> Vocab:
    """A vocab.safetensors file, or a drafter folder (config.json + weights holding d2t/t2d)."""
    path = Path(path)
    if not path.exists():
        raise SpecdraftError(f"{path}: mapping not found (expected vocab.safetensors or a drafter folder)")
    if path.is_dir():
        if not (path / "config.json").exists():
            raise SpecdraftError(f"{path}: not a drafter folder (no config.json) and not a vocab file")
        cfg = read_drafter_config(path)
        tensors = _read_tensors(path, ("d2t", "t2d"))
        if "d2t" not in tensors:
            raise SpecdraftError(f"{path}: the drafter weights hold no d2t (a drafter with the full "
                                 "target vocab has no mapping)")
        vsize = (cfg.get("transformer_layer_config") or {}).get("vocab_size") or cfg.get("vocab_size")
        d2t = integer_d2t(tensors["d2t"], str(path), "save the drafter's d2t as int64")
        t2d = tensors.get("t2d")
        if t2d is None:
            if not vsize:
                raise SpecdraftError(f"{path}: no t2d and no vocab_size in config.json; cannot size the mapping")
            check_mapping(d2t, None, str(path), int(vsize))
            t2d = t2d_from_d2t(d2t, int(vsize))
        check_mapping(d2t, t2d, str(path))
        verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path", "")
        return Vocab(d2t, t2d.bool(), {"source": str(path), "target_id": verifier or ""})
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            raw = dict(f.metadata() or {})
            meta = header_of(raw, path)
            keys = set(f.keys())
            if "d2t" not in keys:
                raise SpecdraftError(f"{path}: no 'd2t' tensor; build one with `specdraft vocab build`")
            d2t = integer_d2t(f.get_tensor("d2t"), str(path))
            t2d = f.get_tensor("t2d") if "t2d" in keys else None
    except SafetensorError as e:
        raise SpecdraftError(f"{path}: not a readable safetensors file ({e})") from None
    if t2d is None:
        vsize = meta.get("target_vocab_size")
        if not vsize:
            raise SpecdraftError(f"{path}: no 't2d' tensor and no target_vocab_size in its header")
        check_mapping(d2t, None, str(path), int(vsize))
        t2d = t2d_from_d2t(d2t, int(vsize))
    check_mapping(d2t, t2d, str(path))
    meta["source"] = str(path)
    return Vocab(d2t, t2d.bool(), meta)


def header_of(raw: dict, path: Path) -> dict:
    """The specdraft header of a vocab file's safetensors metadata (its one "specdraft" key, or the
    plain keys of an older or foreign file), its fields' types checked by its one schema (schemas/vocab.py)."""
    fix = "rebuild it with `specdraft vocab build`"
    if "specdraft" not in raw:   # metadata values are strings here: the counts must be digits
        meta = dict(raw)
        for key in COUNTS:
            if isinstance(meta.get(key), str) and meta[key].isdigit():
                meta[key] = int(meta[key])
        check_model({k: meta[k] for k in COUNTS if k in meta}, VocabHeader, path, fix)
        return meta
    else:
        try:
            meta = json.loads(raw["specdraft"])
        except json.JSONDecodeError as e:
            raise SpecdraftError(f"{path}: header field 'specdraft' is not valid JSON ({e}); {fix}") from None
        if not isinstance(meta, dict):
            raise SpecdraftError(f"{path}: header field 'specdraft' is a {type(meta).__name__}, expected an "
                                 f"object {{...}}; {fix}")
    check_model(meta, VocabHeader, path, fix)
    return meta


# ----------------------------------------------------------------------------- diff

def diff(a: Vocab, b: Vocab) -> dict:
    """How B's draft rows relate to A's: token-set overlap, positional matches, rows that carry over."""
    ta, tb = a.draft_to_target, b.draft_to_target
    na, nb = ta.numel(), tb.numel()
    overlap = int(np.intersect1d(ta.numpy(), tb.numpy()).size)
    k = min(na, nb)
    positional = int((ta[:k] == tb[:k]).sum())
    same_target_vocab = a.target_vocab_size == b.target_vocab_size
    if same_target_vocab and na == nb and positional == nb:
        verdict = "identical"
    elif overlap == na == nb:
        verdict = "same set, permuted: remap required"
    elif nb and positional / nb < 0.5:
        verdict = "scrambled: remap required"
        if overlap / nb < 0.5:
            verdict += "; low overlap: most rows have no source (consider training from scratch)"
    else:
        verdict = "partly aligned: remap required"
    return {
        "a": a.meta.get("source", ""), "b": b.meta.get("source", ""),
        "draft_vocab_size": {"a": na, "b": nb},
        "target_vocab_size": {"a": a.target_vocab_size, "b": b.target_vocab_size},
        "overlap": {"count": overlap, "fraction_of_a": overlap / na if na else 0.0,
                    "fraction_of_b": overlap / nb if nb else 0.0},
        "positional_matches": {"count": positional, "of": nb, "fraction": positional / nb if nb else 0.0},
        "carried_rows": overlap,            # B rows whose token is also in A (remap moves them)
        "moved_rows": overlap - positional,  # of those, rows at a different draft id
        "unsourced_rows": nb - overlap,     # B rows with no row in A
        "remap_required": verdict != "identical",
        "verdict": verdict,
    }


def format_diff(d: dict) -> str:
    """Readable text of diff()."""
    dv, tv, ov, pm = d["draft_vocab_size"], d["target_vocab_size"], d["overlap"], d["positional_matches"]
    lines = [
        f"A: {d['a']}  (draft {dv['a']}, target {tv['a']})",
        f"B: {d['b']}  (draft {dv['b']}, target {tv['b']})",
        f"token-set overlap:    {ov['count']} ({ov['fraction_of_b']:.1%} of B, {ov['fraction_of_a']:.1%} of A)",
        f"positional matches:   {pm['count']}/{pm['of']} ({pm['fraction']:.1%}) draft ids map to the same token",
        f"rows carried A->B:    {d['carried_rows']} ({d['moved_rows']} move to another draft id)",
        f"rows without source:  {d['unsourced_rows']}",
        f"verdict: {d['verdict']}",
    ]
    if tv["a"] != tv["b"]:
        lines.append("note: target vocab sizes differ; are these mappings for the same tokenizer?")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- remap

@dataclass
class Remap:
    src: torch.Tensor            # int64 [draft_vocab_B]: A's draft id for each B row, or -1
    carried: int
    unsourced: list[int]         # B draft ids with no source row in A


def tokenizer_fingerprint(tokenizer) -> str:
    """Identity of a tokenizer's token -> id table (not of the model: siblings share it, and
    padded embedding rows do not change it). Recorded in vocab files so remap can compare."""
    table = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return hashlib.sha256(table.encode()).hexdigest()[:16]


def check_same_tokenizer(a: Vocab, b: Vocab) -> None:
    """A remap moves rows by target id, which only means the same token under one tokenizer."""
    ta, tb = a.meta.get("tokenizer"), b.meta.get("tokenizer")
    if ta and tb and ta != tb:
        raise SpecdraftError(f"vocab remap: {a.meta.get('source', 'A')} and {b.meta.get('source', 'B')} were built "
                             f"with different tokenizers ({ta} vs {tb}), so one target id names different tokens; "
                             "remap only between mappings of one tokenizer, or train the drafter from scratch")


def remap(a: Vocab, b: Vocab) -> Remap:
    """Row permutation that moves A's lm_head rows to B's draft ids (by shared target token)."""
    check_same_tokenizer(a, b)
    vsize = max(a.target_vocab_size, b.target_vocab_size)
    a_row_of_token = torch.full((vsize,), -1, dtype=torch.long)     # [V] A's draft id per target id
    a_row_of_token[a.draft_to_target] = torch.arange(a.draft_vocab_size)
    src = a_row_of_token[b.draft_to_target]                          # [N_B]
    unsourced = torch.nonzero(src < 0).flatten().tolist()
    return Remap(src=src, carried=int((src >= 0).sum()), unsourced=unsourced)


def save_remap(r: Remap, out: str | Path) -> None:
    from safetensors.torch import save_file

    header = {"format": "specdraft-remap", "format_version": FORMAT_VERSION, "carried": r.carried,
              "unsourced": len(r.unsourced), "draft_vocab_size": int(r.src.numel())}
    with atomic_path(out) as tmp:
        save_file({"src": r.src.contiguous()}, str(tmp), metadata={"specdraft": json.dumps(header, sort_keys=True)})


def remap_lm_head(weight_a: torch.Tensor, a: Vocab, b: Vocab,
                  fallback_rows_from_target: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """lm_head [N_A, H] for mapping A -> [N_B, H] for mapping B.

    Shared tokens keep their row; B rows without a source take the target lm_head row of their
    token (`fallback_rows_from_target` [V, H]) or zeros. Returns (weight, counts)."""
    if weight_a.shape[0] != a.draft_vocab_size:
        raise SpecdraftError(f"lm_head has {weight_a.shape[0]} rows but mapping A has {a.draft_vocab_size} "
                             "draft tokens; pass the mapping the drafter was trained with")
    r = remap(a, b)
    hidden = weight_a.shape[1]
    new = torch.zeros(b.draft_vocab_size, hidden, dtype=weight_a.dtype)   # [N_B, H]
    have = r.src >= 0
    new[have] = weight_a[r.src[have]]
    from_target = 0
    if fallback_rows_from_target is not None and r.unsourced:
        fb = fallback_rows_from_target
        if fb.shape[1] != hidden or fb.shape[0] < b.target_vocab_size:
            raise SpecdraftError(f"fallback lm_head {tuple(fb.shape)} does not fit [target_vocab "
                                 f"{b.target_vocab_size}, H {hidden}]")
        rows = torch.tensor(r.unsourced, dtype=torch.long)
        new[rows] = fb[b.draft_to_target[rows]].to(weight_a.dtype)
        from_target = len(r.unsourced)
    counts = {"carried": r.carried, "from_target": from_target,
              "zeros": len(r.unsourced) - from_target, "draft_vocab_size": b.draft_vocab_size}
    return new, counts

