"""The hidden-state store (WS/hidden): what `capture` writes and `train` reads.

    WS/hidden/manifest.json             format, target identity, layer ids, dtype, H, shards
    WS/hidden/shard-00000.safetensors   many samples, token-major:
        aux        [tokens, n, H]  residual stream entering the n aux layers (bf16 | fp16 | fp32)
        last       [tokens, H]     last decoder layer output, before the final norm
        (the manifest's store_format says how aux and last are kept: data/store_formats.py)
        input_ids  [tokens]        int64 (int32 accepted)
        loss_mask  [tokens]        uint8, 1 on trained (assistant) tokens
        offsets    [samples + 1]   int64, sample k of the shard is tokens offsets[k]:offsets[k+1]

Shards are written whole and atomically (temp file, fsync, rename) and the manifest is
rewritten after each one, so a killed capture leaves only complete, hashed shards behind.
Readers memory-map the shards (safetensors `safe_open`) and slice one sample at a time.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import ValidationError

from specdraft.data import store_formats as sf
from specdraft.schemas.manifest import MANIFEST, STORE_DTYPE_NAMES, Manifest, safe_shard_path
from specdraft.errors import SpecdraftError
from specdraft.io import atomic_path, read_json, sha256_file, write_json

FORMAT = "specdraft-hidden-store"
FORMAT_VERSION = 1
SHARD_NAME = re.compile(r"^shard-\d{5,}\.safetensors$")
STORE_DTYPES = dict(zip(STORE_DTYPE_NAMES, (torch.bfloat16, torch.bfloat16, torch.float16, torch.float16, torch.float32,
                                             torch.float32)))
TENSORS = ("input_ids", "loss_mask", "offsets")   # in every shard; the hidden states depend on the format
MAX_OPEN_SHARDS = 4   # memory-mapped shards a reader keeps open at once


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def dtype_name(dtype: str | torch.dtype) -> str:
    """Canonical name ('bfloat16', 'float16', 'float32') of a store dtype, or a one-line error."""
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    if dtype not in STORE_DTYPES:
        raise SpecdraftError(f"--store-dtype {dtype}: unsupported; use bfloat16, float16 or float32")
    return str(STORE_DTYPES[dtype]).removeprefix("torch.")


def bytes_per_token(hidden_size: int, dtype: str | torch.dtype, ids_bytes: int = 8, num_aux: int = 3,
                    store_format: str = sf.DEFAULT_FORMAT, topk: int = sf.DEFAULT_TOPK) -> int:
    """Store bytes per token: the aux layers' + the last hidden states (or the teacher's top-k) in the
    store format, plus the id and mask byte."""
    return sf.bytes_per_token(store_format, hidden_size, num_aux, STORE_DTYPES[dtype_name(dtype)].itemsize, topk,
                              ids_bytes)


def plan_shards(lengths: list[int], shard_tokens: int) -> list[tuple[int, int]]:
    """Consecutive sample ranges [start, end) of at most ~shard_tokens tokens each.

    Deterministic in (lengths, shard_tokens), which is what lets a resumed capture write
    byte-identical shards. A sample longer than shard_tokens gets a shard of its own.
    """
    if shard_tokens <= 0:
        raise SpecdraftError(f"--shard-tokens {shard_tokens}: must be positive")
    ranges, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and tokens + n > shard_tokens:
            ranges.append((start, i))
            start, tokens = i, 0
        tokens += n
    if start < len(lengths):
        ranges.append((start, len(lengths)))
    return ranges


# ---------------------------------------------------------------------------- manifest


def resumable(root: Path, manifest: dict) -> dict:
    """An unfinished store's manifest cut to its leading shards whose files still hash as recorded
    (what a resumed capture or conversion keeps), with the counts of those shards; never complete."""
    good = []
    for entry in manifest["shards"]:
        path = safe_shard_path(root, entry["file"])
        if not path.is_file() or sha256_file(path) != entry["sha256"]:
            break
        good.append(entry)
    return {**manifest, "shards": good, "num_samples": good[-1]["samples"][1] if good else 0,
            "num_tokens": sum(e["num_tokens"] for e in good), "complete": False}


def is_int(value: object) -> bool:
    """A JSON integer (bool is an int subclass in Python, but not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def manifest_error(path: Path, field: str, problem: str, shard: str = "") -> SpecdraftError:
    """One line naming manifest.json, the field and the fix (a bad manifest cannot be resumed from)."""
    where = f"field '{field}'" + (f" of shard {shard}" if shard else "")
    return SpecdraftError(f"{path}: {where} {problem}; the manifest is damaged or hand-edited: "
                          "re-capture into an empty --out")


MUST = {"target": "must be an object naming the target (id, fingerprint)",
        "layer_ids": "must be a list of layer numbers",
        "dtype": "must be bfloat16, float16 or float32", "hidden_size": "must be a positive integer",
        "num_samples": "must be a non-negative integer", "num_tokens": "must be a non-negative integer",
        "complete": "must be true or false", "shards": "must be a list of shard entries",
        **{f"target.{k}": "must be a positive integer" for k in ("num_layers", "hidden_size", "vocab_size")},
        "shard.samples": "must be [start, end]", "shard.num_tokens": "must be a non-negative integer",
        "shard.sha256": "must be a hex string", "part": "must be [index, count] with 1 <= index <= count"}


def manifest_type_error(path: Path, manifest: dict, error: ValidationError) -> SpecdraftError:
    """The first wrong field pydantic found as read_manifest's one line (a missing field first)."""
    errors = error.errors()
    err = next((e for e in errors if e["type"] == "missing" and len(e["loc"]) == 1), errors[0])
    loc = err["loc"]
    if err["type"] == "missing" and len(loc) == 1:
        return SpecdraftError(f"{path}: missing field '{loc[0]}'; re-run capture")
    if loc[0] == "shards" and len(loc) > 1:
        entry = manifest["shards"][loc[1]]
        if len(loc) == 2 or err["type"] == "missing":
            return SpecdraftError(f"{path}: malformed shard entry {entry!r}; re-run capture")
        field = loc[2]
        if field == "file":
            return SpecdraftError(str(err["ctx"]["error"]))
        return manifest_error(path, field, f"{MUST['shard.' + field]}, got {json.dumps(entry[field])}", entry["file"])
    if loc[0] == "target" and len(loc) > 1 and loc[1] != "fingerprint":
        field, value = f"target.{loc[1]}", manifest["target"][loc[1]]
    else:
        field, value = loc[0], manifest[loc[0]]
    return manifest_error(path, field, f"{MUST[field]}, got {json.dumps(value)}")


def read_manifest(root: str | Path) -> dict:
    """Read manifest.json and check it field by field (types through the Manifest model, shard file
    names, totals), so a bad one fails here, in `capture --verify` too, and never halfway through training."""
    root = Path(root)
    path = root / MANIFEST
    if not root.is_dir():
        raise SpecdraftError(f"{root}: hidden-state store not found; run `specdraft capture --out {root}`")
    if not path.exists() and (root / "prepare.json").exists():
        raise SpecdraftError(f"{root}: prepared data (from `specdraft prepare`), not a hidden-state store; "
                             "pass the folder `specdraft capture` wrote (--store WS/hidden)")
    if not path.exists():
        raise SpecdraftError(f"{path}: not found; {root} is not a finished hidden-state store "
                             "(run `specdraft capture`, or --resume an interrupted one)")
    manifest = read_json(path, "hidden-store manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SpecdraftError(f"{path}: not a specdraft hidden-store manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise SpecdraftError(f"{path}: format_version {manifest.get('format_version')} is not supported "
                             f"(this specdraft reads {FORMAT_VERSION}); re-run capture")
    try:
        Manifest.model_validate(manifest, context={"root": root})
    except ValidationError as e:
        raise manifest_type_error(path, manifest, e) from None
    check_against_target(path, manifest)
    check_format_fields(path, manifest)
    expect, tokens = 0, 0
    for entry in manifest["shards"]:
        start, end = entry["samples"]
        if start != expect or end < start:
            raise SpecdraftError(f"{path}: shard {entry['file']} covers samples [{start}, {end}) but the "
                                 f"previous shard ended at {expect}; re-run capture")
        expect, tokens = end, tokens + entry["num_tokens"]
    if (expect, tokens) != (manifest["num_samples"], manifest["num_tokens"]):
        raise SpecdraftError(f"{path}: fields 'num_samples'/'num_tokens' say {manifest['num_samples']} samples, "
                             f"{manifest['num_tokens']} tokens but the shards listed hold {expect} samples, "
                             f"{tokens} tokens: the manifest lists only some of its shards; re-capture into "
                             "an empty --out")
    if manifest.get("complete"):
        check_all_shards_listed(root, manifest)
    return manifest


def check_against_target(path: Path, manifest: dict) -> None:
    """The manifest's own numbers against the target it records (target.num_layers, hidden_size,
    vocab_size; older stores may lack them): layer ids beyond the target, or another width, were
    trusted until a drafter built from them failed (or trained on the wrong layers)."""
    target = manifest["target"]                      # its types checked by ManifestTarget
    layers = target.get("num_layers")
    if layers is not None and any(i >= layers for i in manifest["layer_ids"]):
        raise manifest_error(path, "layer_ids", f"{json.dumps(manifest['layer_ids'])} reach beyond the target's "
                                                f"{layers} layers (target.num_layers; ids are 0..{layers - 1})")
    width = target.get("hidden_size")
    if width is not None and width != manifest["hidden_size"]:
        raise manifest_error(path, "hidden_size", f"is {manifest['hidden_size']} but the target's is {width} "
                                                  "(target.hidden_size)")


def check_format_fields(path: Path, manifest: dict) -> None:
    """store_format and the fields its decoding reads (older stores have none: bf16)."""
    name = sf.manifest_format(manifest)
    if name not in sf.FORMATS:
        raise manifest_error(path, "store_format", f"must be one of {', '.join(sf.FORMATS)}, got {json.dumps(name)}")
    if name != "compact":
        return
    if manifest.get("group_size") != sf.group_size(manifest["hidden_size"]):
        raise manifest_error(path, "group_size", f"must be {sf.group_size(manifest['hidden_size'])} for hidden size "
                                                 f"{manifest['hidden_size']}, got {json.dumps(manifest.get('group_size'))}")
    k = manifest.get("teacher_topk")
    if not is_int(k) or k < 1:
        raise manifest_error(path, "teacher_topk", f"must be a positive integer, got {json.dumps(k)}")


def check_samples(path: Path, handle, start: int, offsets: list[int], vocab_size: int | None) -> None:
    """A shard's token ids within the target's vocabulary and at least one trained token (loss_mask
    1) in every sample: reads only input_ids and loss_mask (9 bytes a token), once, at open."""
    fix = "the store is damaged or was written by another tool: re-capture into an empty --out"
    ids = handle.get_tensor("input_ids")
    bad = (ids < 0) | (ids >= vocab_size) if vocab_size is not None else ids < 0
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        sample = start + bisect.bisect_right(offsets, t) - 1
        limit = f"the target's vocabulary of {vocab_size} (target.vocab_size)" if vocab_size else "0"
        raise SpecdraftError(f"{path}: sample {sample} holds token id {int(ids[t])}, outside {limit}; {fix}")
    trained = torch.cat([torch.zeros(1, dtype=torch.int64), handle.get_tensor("loss_mask").to(torch.int64).cumsum(0)])
    ends = torch.tensor(offsets)
    empty = (trained[ends[1:]] - trained[ends[:-1]] == 0).nonzero()
    if len(empty):
        raise SpecdraftError(f"{path}: sample {start + int(empty[0])} has no trained token (its loss_mask is all "
                             f"0), so it teaches nothing and counts as data; {fix}")


def check_all_shards_listed(root: Path, manifest: dict) -> None:
    """A finished store lists every shard in its folder and every sample of its prepared data;
    anything else means two captures shared the folder or shard entries were dropped."""
    path = root / MANIFEST
    listed = {entry["file"] for entry in manifest["shards"]}
    stray = sorted(p.name for p in root.iterdir() if SHARD_NAME.match(p.name) and p.name not in listed)
    if stray:
        raise SpecdraftError(f"{path}: field 'shards' does not list {', '.join(stray[:3])} found in {root}: "
                             "the manifest lists only some of its shards (or two captures shared the folder); "
                             "re-capture into an empty --out")
    data = manifest.get("data")
    want = data.get("num_samples") if isinstance(data, dict) else None
    if is_int(want) and want != manifest["num_samples"]:
        raise SpecdraftError(f"{path}: field 'num_samples' is {manifest['num_samples']} but the store is marked "
                             f"complete and its prepared data (data.num_samples) has {want}: the manifest lists "
                             "only some of its shards; re-capture into an empty --out")


def new_manifest(target: dict, layer_ids: list[int], dtype: str, hidden_size: int,
                 store_format: str = sf.DEFAULT_FORMAT, topk: int = sf.DEFAULT_TOPK, **extra) -> dict:
    """A store's manifest before its first shard; dtype is what readers decode to (bf16: also
    what is stored)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "target": dict(target),
            "layer_ids": list(layer_ids), "dtype": dtype_name(dtype), "hidden_size": int(hidden_size),
            **sf.format_fields(store_format, int(hidden_size), topk),
            "num_samples": 0, "num_tokens": 0, "complete": False, **extra, "shards": []}


# ---------------------------------------------------------------------------- writer


@dataclass
class StoreWriter:
    """Writes shards one at a time, each atomically, and the manifest after each.

    `manifest` is the dict from `new_manifest` (or a resumed one truncated to its good shards).
    `teacher` (store_formats.TopKTeacher) is the target's head, which a compact store needs to keep
    the teacher's top-k instead of the last hidden state.
    """

    root: Path
    manifest: dict
    teacher: sf.TopKTeacher | None = None

    def __post_init__(self):
        self.root = Path(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.dtype = STORE_DTYPES[self.manifest["dtype"]]
        self.hidden_size = int(self.manifest["hidden_size"])

    @property
    def next_shard(self) -> int:
        return len(self.manifest["shards"])

    @property
    def next_sample(self) -> int:
        shards = self.manifest["shards"]
        return shards[-1]["samples"][1] if shards else 0

    def write_shard(self, aux: torch.Tensor, last: torch.Tensor, input_ids: torch.Tensor,
                    loss_mask: torch.Tensor, offsets: torch.Tensor) -> dict:
        """Write the next shard (samples next_sample.. next_sample + len(offsets) - 1)."""
        from safetensors.torch import save_file

        n, H, n_aux = int(offsets[-1]), self.hidden_size, len(self.manifest["layer_ids"])
        if aux.shape != (n, n_aux, H) or last.shape != (n, H) or input_ids.shape != (n,) or loss_mask.shape != (n,):
            raise ValueError(f"shard tensors disagree: aux {tuple(aux.shape)}, last {tuple(last.shape)}, "
                             f"input_ids {tuple(input_ids.shape)}, loss_mask {tuple(loss_mask.shape)}, {n} tokens")
        start = self.next_sample
        end = start + len(offsets) - 1
        name = shard_name(self.next_shard)
        hidden = sf.encode(self.manifest, aux, last, self.dtype, self.teacher)
        tensors = {**{k: v.contiguous() for k, v in hidden.items()},
                   "input_ids": input_ids.contiguous(), "loss_mask": loss_mask.to(torch.uint8).contiguous(),
                   "offsets": offsets.to(torch.int64).contiguous()}
        # One metadata key: safetensors writes several in hash order, which would make
        # otherwise identical shards (e.g. after a resume) differ byte-wise.
        # What the shard is, beside the manifest: a reader checks a shard's header against the
        # manifest, so a folder mixing two captures (other dtype, layers, target) is refused.
        metadata = {"specdraft": json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION,
                                             "samples": [start, end], **shard_identity(self.manifest)},
                                            sort_keys=True)}
        with atomic_path(self.root / name) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
            digest = sha256_file(tmp)
        entry = {"file": name, "samples": [start, end], "num_tokens": n, "sha256": digest}
        self.manifest["shards"].append(entry)
        self.manifest["num_samples"] = end
        self.manifest["num_tokens"] += n
        self.save()
        return entry

    def save(self, complete: bool | None = None) -> None:
        if complete is not None:
            self.manifest["complete"] = complete
        write_json(self.root / MANIFEST, self.manifest)


# ---------------------------------------------------------------------------- reader

def shard_identity(manifest: dict) -> dict:
    """The capture settings every shard records in its metadata (older shards lack them; bf16 shards
    do not name their format, so they stay byte-identical to those written before formats existed)."""
    identity = {"layer_ids": list(manifest["layer_ids"]), "dtype": manifest["dtype"],
                "hidden_size": int(manifest["hidden_size"]), "target": manifest["target"].get("fingerprint", "")}
    if sf.manifest_format(manifest) != sf.DEFAULT_FORMAT:
        identity["store_format"] = sf.manifest_format(manifest)
    return identity


def check_shard(path: Path, handle, entry: dict, manifest: dict) -> None:
    """A shard's header (metadata, tensor dtypes and shapes; no data read) against the manifest,
    so a folder mixing two captures fails with one line instead of training on both."""
    fix = "the store mixes shards of different captures: re-capture into an empty --out"
    try:
        meta = json.loads((handle.metadata() or {}).get("specdraft", "{}"))
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise SpecdraftError(f"{path}: metadata 'specdraft' is not a JSON object; {fix}")
    start, end = entry["samples"]
    recorded = {"samples": [start, end], **shard_identity(manifest)}
    for field, want in recorded.items():
        if field in meta and meta[field] != want:
            raise SpecdraftError(f"{path}: {field} {json.dumps(meta[field])} but {MANIFEST} says "
                                 f"{json.dumps(want)}; {fix}")
    n, H = entry["num_tokens"], manifest["hidden_size"]
    layout = sf.tensor_layout(manifest, n)
    store_format = sf.manifest_format(manifest)
    for name, (dtype, _) in layout.items():
        if name not in handle.keys():
            raise SpecdraftError(f"{path}: no tensor '{name}', which store_format {store_format} keeps; {fix}")
        got = handle.get_slice(name).get_dtype()
        if got != dtype:
            raise SpecdraftError(f"{path}: tensor '{name}' is {got} but {MANIFEST} says store_format "
                                 f"{store_format}, dtype {manifest['dtype']} ({dtype}); {fix}")
    n_aux = len(manifest["layer_ids"])
    shapes = {**{name: shape for name, (_, shape) in layout.items()},
              "input_ids": [n], "loss_mask": [n], "offsets": [end - start + 1]}
    for name, want in shapes.items():
        got = list(handle.get_slice(name).get_shape())
        if got != want:
            raise SpecdraftError(f"{path}: tensor '{name}' has shape {got} but {MANIFEST} implies {want} "
                                 f"(num_tokens {n}, {n_aux} aux layers, hidden_size {H}, samples [{start}, {end})); {fix}")


def open_shard(path: Path):
    """safe_open a shard (memory-mapped), turning a truncated/corrupt file into one line."""
    from safetensors import safe_open

    if not path.is_file():
        raise SpecdraftError(f"{path}: shard listed in the manifest is missing; re-run capture with --resume")
    try:
        handle = safe_open(str(path), framework="pt")
        keys = set(handle.keys())
    except Exception as e:  # safetensors raises its own error types for bad headers / short files
        raise SpecdraftError(f"{path}: corrupt or truncated shard ({str(e).splitlines()[0]}); "
                             "delete it and re-run capture with --resume") from None
    missing = [k for k in TENSORS if k not in keys]
    if missing:
        raise SpecdraftError(f"{path}: not a hidden-store shard (missing {', '.join(missing)}); re-run capture")
    return handle


def verify_shards(root: str | Path, manifest: dict | None = None) -> None:
    """Re-hash every shard; raise one error listing every shard whose sha256 does not match."""
    root = Path(root)
    manifest = manifest if manifest is not None else read_manifest(root)
    bad, missing = [], []
    for entry in manifest["shards"]:
        path = safe_shard_path(root, entry["file"])
        if not path.is_file():
            missing.append(entry["file"])
        elif sha256_file(path) != entry["sha256"]:
            bad.append(entry["file"])
    problems = []
    if bad:
        problems.append(f"sha256 mismatch in {', '.join(bad)} (corrupt or modified)")
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if problems:
        raise SpecdraftError(f"{root}: {'; '.join(problems)}; delete the bad shards and re-run "
                             "`specdraft capture --resume` (it re-captures from the first bad shard)")


FINITE_CHECK_ROWS = 4096   # rows converted to float32 at a time: flat memory on big shards


def check_shard_finite(path: Path) -> None:
    """Every floating tensor of a shard (hidden states, fp8 scales) finite, read in row chunks: a
    shard of NaN with a matching sha256 would train and evaluate silently (capture --verify runs it)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            part = f.get_slice(key)
            if not part.get_dtype().startswith(("F", "BF")):
                continue
            rows = part.get_shape()[0] if part.get_shape() else 0
            for start in range(0, rows, FINITE_CHECK_ROWS):
                chunk = part[start:start + FINITE_CHECK_ROWS].float()
                bad = ~torch.isfinite(chunk).reshape(len(chunk), -1).all(dim=1)
                if bad.any():
                    row = start + int(bad.nonzero()[0, 0])
                    raise SpecdraftError(f"{path}: tensor '{key}' holds NaN or inf (token row {row}); training "
                                         "and eval would read it silently: delete the shard and re-run `specdraft "
                                         "capture --resume` (with --compute-dtype float32 if the target overflows)")


class HiddenStore(torch.utils.data.Dataset):
    """Random access to captured samples: store[i] -> dict(input_ids [T] long, loss_mask [T] uint8,
    aux [T, n_aux, H], last [T, H]) read through memory-mapped safetensors, one sample at a time.

    verify=True re-hashes every shard first (slow on big stores, but never trusts a bad one).
    Shards open lazily per process, so DataLoader workers each map their own.
    """

    def __init__(self, path: str | Path, verify: bool = False, allow_incomplete: bool = False):
        self.root = Path(path)
        self.manifest = read_manifest(self.root)
        if not self.manifest.get("complete", False) and not allow_incomplete:
            source = (self.manifest.get("converted_from") or {}).get("path") \
                if isinstance(self.manifest.get("converted_from"), dict) else None
            again = (f"`specdraft store convert {source} --store-format {sf.manifest_format(self.manifest)} --out "
                     f"{self.root}`" if source else "`specdraft capture --resume` with the same --out")
            raise SpecdraftError(f"{self.root}: {'conversion' if source else 'capture'} did not finish "
                                 f"({len(self.manifest['shards'])} shards, {self.manifest['num_samples']} samples so "
                                 f"far); re-run {again}")
        if verify:
            verify_shards(self.root, self.manifest)
        self.shards = self.manifest["shards"]
        self._starts = [s["samples"][0] for s in self.shards]
        self._handles: OrderedDict[int, object] = OrderedDict()   # open shards, least recently used first
        self._offsets: dict[int, list[int]] = {}
        # every shard's header, offsets, token ids and loss masks checked now, naming the store's file
        # and sample, not halfway through a run (DataLoader workers' copies do not repeat it)
        vocab_size = self.manifest["target"].get("vocab_size")
        for k, entry in enumerate(self.shards):
            handle = self._handle(k)
            check_samples(safe_shard_path(self.root, entry["file"]), handle, entry["samples"][0], self._offsets[k],
                          vocab_size)

    # -- metadata
    def __len__(self) -> int:
        return int(self.manifest["num_samples"])

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["hidden_size"])

    @property
    def layer_ids(self) -> list[int]:
        return list(self.manifest["layer_ids"])

    @property
    def target(self) -> dict:
        return dict(self.manifest["target"])

    @property
    def dtype(self) -> torch.dtype:
        return STORE_DTYPES[self.manifest["dtype"]]

    @property
    def store_format(self) -> str:
        return sf.manifest_format(self.manifest)

    @property
    def teacher_topk(self) -> int:
        """K of a compact store's teacher top-k (0: the store keeps the last hidden state)."""
        return int(self.manifest.get("teacher_topk", 0)) if self.store_format == "compact" else 0

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    @property
    def sample_lengths(self) -> list[int]:
        """Token count of every sample, in store order (reads only the small offsets tensors)."""
        lengths: list[int] = []
        for k in range(len(self.shards)):
            off = self._shard_offsets(k)
            lengths.extend(b - a for a, b in zip(off[:-1], off[1:]))
        return lengths

    # -- access
    def _handle(self, k: int):
        if k in self._handles:
            self._handles.move_to_end(k)
            return self._handles[k]
        path = safe_shard_path(self.root, self.shards[k]["file"])
        handle = open_shard(path)
        if k not in self._offsets:   # first open: the header must agree with the manifest
            check_shard(path, handle, self.shards[k], self.manifest)
            off = handle.get_tensor("offsets").tolist()
            start, end = self.shards[k]["samples"]
            if len(off) != end - start + 1 or off[0] != 0 or off[-1] != self.shards[k]["num_tokens"]:
                raise SpecdraftError(f"{path}: offsets disagree with the manifest (samples [{start}, {end}), "
                                     f"{self.shards[k]['num_tokens']} tokens); re-run capture")
            shrinking = [j for j in range(len(off) - 1) if off[j + 1] <= off[j]]
            if shrinking:
                j = shrinking[0]
                raise SpecdraftError(f"{path}: offsets are not increasing at sample {start + j} (offsets[{j}] = "
                                     f"{off[j]}, offsets[{j + 1}] = {off[j + 1]}): a sample of no tokens, or "
                                     "samples overlapping; re-run capture into an empty --out")
            self._offsets[k] = off
        self._handles[k] = handle
        # Every open memory map keeps the pages it has read resident: with all shards open, a
        # process's RSS grows to the size of the store over an epoch. Keep only a few open.
        while len(self._handles) > MAX_OPEN_SHARDS:
            self._handles.popitem(last=False)
        return handle

    def _shard_offsets(self, k: int) -> list[int]:
        self._handle(k)
        return self._offsets[k]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for a store of {len(self)} samples")
        i = i % len(self)
        k = bisect.bisect_right(self._starts, i) - 1
        handle = self._handle(k)
        j = i - self._starts[k]
        a, b = self._offsets[k][j], self._offsets[k][j + 1]
        # aux [T, n_aux, H] and last [T, H] in self.dtype (compact: teacher_ids, teacher_logp [T, K])
        hidden = sf.decode(self.manifest, lambda name: handle.get_slice(name)[a:b], self.dtype)
        return {"input_ids": handle.get_slice("input_ids")[a:b].long(),
                "loss_mask": handle.get_slice("loss_mask")[a:b], **hidden}

    def __getstate__(self):
        # safetensors handles do not pickle; each DataLoader worker opens its own.
        state = self.__dict__.copy()
        state["_handles"], state["_offsets"] = OrderedDict(), {}
        return state
