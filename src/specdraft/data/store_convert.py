"""`specdraft store convert`: re-write a finished store in another store format, shard by shard,
with the same samples in the same shards (data/store_formats.py says what each format keeps).

The manifest goes down (complete: false, `converted_from` naming the source) before the first shard
and after each, as capture's does, so a conversion killed midway leaves an unfinished store that no
reader takes as complete; the same command again continues it from its first missing or bad shard
(the shards come out byte-identical to an uninterrupted run). The source is only read."""

from __future__ import annotations

from pathlib import Path

import json
import sys

import torch

from specdraft.data import store as st
from specdraft.data import store_formats as sf
from specdraft.errors import SpecdraftError
from specdraft.outputs import LOCK_NAME

# the manifest fields that describe the shards, not the capture: rewritten by the writer
SHARD_FIELDS = ("shards", "num_samples", "num_tokens", "complete", "store_format", "group_size", "teacher_topk")
CONVERTED_FROM = "converted_from"   # the manifest field naming the source store (its path)


def converted_manifest(manifest: dict, store_format: str, topk: int) -> dict:
    """The source's manifest (target, layers, data, part...) in the new format, before any shard."""
    capture = {k: v for k, v in manifest.items() if k not in SHARD_FIELDS and k not in
               ("format", "format_version", "target", "layer_ids", "dtype", "hidden_size")}
    return st.new_manifest(manifest["target"], manifest["layer_ids"], manifest["dtype"], manifest["hidden_size"],
                           store_format=store_format, topk=topk, **capture)


def unfinished_conversion(src: Path, out: Path, want: dict) -> dict | None:
    """The manifest of an unfinished conversion of `src` to `want`'s format in `out`, cut back to its
    shards that are present and hash-correct (None when `out` is empty or new). Anything else in
    `out` is refused in one line: a finished store, another conversion, files that are not a store."""
    names = [p.name for p in out.iterdir() if p.name != LOCK_NAME and not p.name.endswith(".tmp")] \
        if out.is_dir() else []
    if not out.exists() or not names:
        return None
    if not out.is_dir() or st.MANIFEST not in names:
        raise SpecdraftError(f"{out}: exists and is not empty; pass a new folder as --out (the source is kept)")
    have = st.read_manifest(out)
    if have.get("complete"):
        raise SpecdraftError(f"{out}: already holds a finished store; pass a new folder as --out (the source is kept)")
    written = ("shards", "num_samples", "num_tokens", "complete")   # the progress, not the settings
    for key in ["store_format", CONVERTED_FROM, *sorted(set(have) | set(want))]:   # the likely one first
        if key in written or have.get(key) == want.get(key):
            continue
        was = have.get(key)
        fix = (f"pass --store-format {was} to finish it" if key == "store_format" else
               f"pass {was.get('path')} as the source to finish it" if key == CONVERTED_FROM and isinstance(was, dict)
               else "it is not a conversion of this store")
        raise SpecdraftError(f"{out / st.MANIFEST}: an unfinished conversion with {key} {json.dumps(was)}, but this "
                             f"one would write {json.dumps(want.get(key))}; {fix}, or delete {out} or pass a new --out")
    for tmp in out.glob(".*.tmp"):   # a shard or manifest half-written when the run was killed
        tmp.unlink(missing_ok=True)
    kept = st.resumable(out, have)
    print(f"note: {out} holds an unfinished conversion of {src} ({len(kept['shards'])} good shards); continuing it",
          file=sys.stderr)
    return kept


def teacher_for(manifest: dict, model: str | None, trust_remote_code: bool) -> sf.TopKTeacher:
    """The target's head (norm + lm_head) for a compact store, refused unless it is the store's target."""
    from specdraft.targets import load_target_head, same_target

    model = model or manifest["target"].get("id")
    if not model:
        raise SpecdraftError("--store-format compact: the store names no target; pass --model (the target it was "
                             "captured from)")
    target = load_target_head(model, device="cuda" if torch.cuda.is_available() else "cpu",
                              trust_remote_code=trust_remote_code)
    have, want = target.identity.get("fingerprint"), manifest["target"].get("fingerprint")
    if have and want and not same_target(want, target.identity):
        raise SpecdraftError(f"--model {model}: fingerprint {have} but the store was captured from "
                             f"{manifest['target'].get('id')} ({want}); pass the target the store was captured from")
    return sf.TopKTeacher.from_model(target.model, sf.DEFAULT_TOPK)


def convert_store(src: str | Path, out: str | Path, store_format: str, model: str | None = None,
                  trust_remote_code: bool = False, topk: int = sf.DEFAULT_TOPK) -> dict:
    """Write `src` (a finished, hash-checked store) again into `out` in `store_format`; returns the
    new manifest. compact keeps no last hidden state, so a compact store converts to nothing else."""
    src, out = Path(src), Path(out)
    sf.check_format(store_format)
    if model is not None and store_format != "compact":
        raise SpecdraftError(f"--model {model}: read only for --store-format compact (its teacher's top-k); "
                             f"--store-format {store_format} copies the hidden states as they are: drop --model")
    store = st.HiddenStore(src, verify=True)
    have = store.store_format
    if have == "compact" and store_format != "compact":
        raise SpecdraftError(f"{src}: a compact store keeps the teacher's top-k, not the last hidden state, so it "
                             f"cannot become {store_format}; convert the bf16 or fp8 store, or re-capture")
    if have == store_format:
        raise SpecdraftError(f"{src}: already store_format {have}; nothing to convert")
    want = {**converted_manifest(store.manifest, store_format, topk), CONVERTED_FROM: {"path": str(src)}}
    manifest = unfinished_conversion(src, out, want) or want
    teacher = teacher_for(store.manifest, model, trust_remote_code) if store_format == "compact" else None
    writer = st.StoreWriter(out, manifest, teacher)
    writer.save()    # before the first shard: a kill from here on leaves an unfinished store, never a bare folder
    for k, entry in enumerate(store.shards):
        if k < writer.next_shard:
            continue     # written by the run this one continues
        handle = store._handle(k)
        hidden = sf.decode(store.manifest, handle.get_tensor, torch.float32)     # the whole shard
        writer.write_shard(hidden["aux"], hidden["last"], handle.get_tensor("input_ids"),
                           handle.get_tensor("loss_mask"), handle.get_tensor("offsets"))
    writer.save(complete=True)
    return writer.manifest
