"""`specdraft capture`: run the target over prepared data and store, per token, the residual
stream entering the aux layers (3 by default, any number with --layers) and the last decoder layer's output before the final norm.

Which tensor is aux and which is last is targets.tap_hidden_states (hooks: aux id l = the input of
decoder layer l, HF's hidden_states[l]; last = the last decoder layer's output before the final
norm), shared with online training, probe and the generation loop. We call the base model
(model.model), never the CausalLM, so no [B, T, vocab] logits are computed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from specdraft.data import store as st
from specdraft.data import store_formats as sf
from specdraft.data.prepared import check_prepared_for, load_prepared, take_part
from specdraft.data.vllm_engine import (
    EngineOptions,
    capture_engine,
    choose_engine,
    engine_options,
    engine_record,
    vllm_capture_samples,
)
from specdraft.defaults import check_compute_dtype
from specdraft.adapter import text_config
from specdraft.errors import SpecdraftError
from specdraft.outputs import LOCK_NAME, ensure_writable_dir
from specdraft.progress import progress as progress_of
from specdraft.targets import (
    DTYPES,
    base_model,
    check_aux_layers,
    default_aux_layers,
    describe_target,
    load_target,
    load_target_head,
    resolve_device,
    same_target,
    tap_hidden_states,
    target_config,
)
from specdraft.dtypes import auto_dtype

# ---------------------------------------------------------------------------- data


def sample_columns(ds) -> tuple[list[int], str, int]:
    """Per-sample token counts, a fingerprint of input_ids + loss_mask (fast, via Arrow), and
    the largest token id."""
    import numpy as np
    import pyarrow.compute as pc

    table = ds.with_format("arrow")[0:len(ds)]
    h = hashlib.sha256()
    lengths, max_id = None, -1
    for col in ("input_ids", "loss_mask"):
        arr = table.column(col)
        col_lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
        if lengths is None:
            lengths = col_lengths
        elif not np.array_equal(lengths, col_lengths):
            row = int(np.nonzero(lengths != col_lengths)[0][0])
            raise SpecdraftError(f"prepared data: row {row} has {lengths[row]} input_ids but "
                                 f"{col_lengths[row]} loss_mask entries; re-run `specdraft prepare`")
        values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.int64)
        if col == "input_ids" and len(values):
            max_id = int(values.max())
            if int(values.min()) < 0:
                raise SpecdraftError("prepared data: negative token id in input_ids; re-run `specdraft prepare`")
        h.update(col.encode())
        h.update(col_lengths.tobytes())
        h.update(values.tobytes())
    lengths = [int(n) for n in lengths]
    empty = [i for i, n in enumerate(lengths) if n == 0]
    if empty:
        raise SpecdraftError(f"prepared data: row {empty[0]} has no tokens; re-run `specdraft prepare`")
    return lengths, h.hexdigest()[:32], max_id


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped into padded batches of at most batch_tokens (rows x longest row):
    longest first, so each batch holds samples of similar length and little padding."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


# ---------------------------------------------------------------------------- hooks


class Recorder:
    """Copies, for each row of the running batch, its real (unpadded) tokens straight into
    preallocated shard buffers, converting to the store dtype on the way. The hooks that call it
    (which tensor is aux, which is last) are targets.tap_hidden_states."""

    def __init__(self):
        self.rows: list[tuple[int, int, int]] = []   # (batch row, first token in shard, length)
        self.aux: torch.Tensor | None = None          # [shard tokens, n_aux, H]
        self.last: torch.Tensor | None = None         # [shard tokens, H]

    def copy_aux(self, slot: int, hidden: torch.Tensor) -> None:
        for b, start, n in self.rows:                 # hidden [B, T, H], input of aux layer `slot`
            self.aux[start:start + n, slot].copy_(hidden[b, :n])

    def copy_last(self, hidden: torch.Tensor) -> None:
        for b, start, n in self.rows:                 # hidden [B, T, H], pre-norm
            self.last[start:start + n].copy_(hidden[b, :n])


@contextmanager
def recording(model, layer_ids: list[int]):
    rec = Recorder()
    with tap_hidden_states(model, layer_ids, rec.copy_aux, rec.copy_last):
        yield rec


@contextmanager
def hidden_state_engine(engine: str, target, layer_ids: list[int], store_dtype: torch.dtype, batch_tokens: int,
                        compute_dtype: str = "float32", opts=None, max_len: int = 2048, scratch: Path | None = None,
                        on_batch=None):
    """A function (samples, first_index) -> (aux [N, n_aux, H], last [N, H], offsets [S+1]) that runs the
    target over token-id lists with `engine`: 'hf' (forward hooks in this process) or 'vllm'
    (extract_hidden_states in a vLLM engine; `scratch` holds its per-request files). The two give
    the same tensors (tests/test_vllm_engine.py), so capture and online training take either."""
    if engine == "vllm":
        with capture_engine(target, layer_ids, compute_dtype, opts, max_len, scratch) as (llm, _):
            def run_vllm(samples: list[list[int]], first_index: int = 0):
                aux, last, offsets = vllm_capture_samples(llm, samples, store_dtype, target.hidden_size, on_batch,
                                                          num_aux=len(layer_ids))
                check_finite(aux, last, offsets, layer_ids, first_index)
                return aux, last, offsets
            yield run_vllm
        return
    with recording(target.model, layer_ids) as rec:
        def run_hf(samples: list[list[int]], first_index: int = 0):
            return capture_samples(target.model, samples, layer_ids, store_dtype, batch_tokens, rec,
                                   on_batch=on_batch, first_index=first_index)
        yield run_hf


def capture_samples(model, samples: list[list[int]], layer_ids: list[int], store_dtype: torch.dtype,
                    batch_tokens: int, rec: Recorder | None = None, on_batch=None, first_index: int = 0):
    """Forward `samples` (token id lists, kept in their order) in length-bucketed batches.

    Returns aux [N, n_aux, H], last [N, H] in store_dtype and offsets [S+1], N = total tokens.
    `rec` is an open `recording` (capture keeps one for all shards); None records for this call.
    """
    if rec is None:
        with recording(model, layer_ids) as rec:
            return capture_samples(model, samples, layer_ids, store_dtype, batch_tokens, rec, on_batch, first_index)
    base = base_model(model)
    H = text_config(model.config).hidden_size
    lengths = [len(s) for s in samples]
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    total = int(offsets[-1])
    rec.aux = torch.empty(total, len(layer_ids), H, dtype=store_dtype)   # [N, n_aux, H]
    rec.last = torch.empty(total, H, dtype=store_dtype)     # [N, H]
    device = next(model.parameters()).device
    for batch in length_batches(lengths, batch_tokens):
        T = lengths[batch[0]]
        ids = torch.zeros(len(batch), T, dtype=torch.long)           # [B, T], right-padded
        mask = torch.zeros(len(batch), T, dtype=torch.long)
        for b, i in enumerate(batch):
            ids[b, :lengths[i]] = torch.tensor(samples[i])
            mask[b, :lengths[i]] = 1
        rec.rows = [(b, int(offsets[i]), lengths[i]) for b, i in enumerate(batch)]
        padded = bool((mask == 0).any())
        with torch.inference_mode():
            base(input_ids=ids.to(device), attention_mask=mask.to(device) if padded else None, use_cache=False)
        if on_batch is not None:
            on_batch(sum(lengths[i] for i in batch))
    rec.rows = []
    check_finite(rec.aux, rec.last, offsets, layer_ids, first_index)
    return rec.aux, rec.last, offsets


def check_finite(aux, last, offsets, layer_ids, first_index: int) -> None:
    """NaN/inf in a hidden state would poison training silently: name the sample instead."""
    bad_aux = ~torch.isfinite(aux).all(dim=-1)    # [N, n_aux]: any number of aux layers
    bad_last = ~torch.isfinite(last).all(dim=-1)  # [N]
    bad = bad_aux.any(dim=-1) | bad_last
    if not bad.any():
        return
    token = int(bad.nonzero()[0, 0])
    sample = int(torch.searchsorted(offsets, torch.tensor(token), right=True)) - 1
    where = [f"aux layer {layer_id}" for k, layer_id in enumerate(layer_ids) if bad_aux[token, k]]
    where += ["last"] if bad_last[token] else []
    raise SpecdraftError(f"sample {first_index + sample}: non-finite hidden states (NaN/inf) at token "
                         f"{token - int(offsets[sample])} in {', '.join(where)}; the target overflows in this "
                         "dtype: try --compute-dtype float32 or --store-dtype float32, or drop the sample")


# ---------------------------------------------------------------------------- capture


def _clean_temp_files(out: Path) -> None:
    """Remove half-written temp files a killed capture may leave (atomic_path names them .NAME.*.tmp;
    a vLLM capture keeps its per-request files in .vllm-hidden-*/)."""
    removed = [p for p in out.glob(".*.tmp") if p.name.startswith((".shard-", f".{st.MANIFEST}."))]
    removed += list(out.glob(".vllm-hidden-*"))
    for p in removed:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    if removed:
        print(f"note: removed {len(removed)} leftover(s) of a capture that stopped midway in {out}",
              file=sys.stderr)


def nothing_captured(out: Path) -> bool:
    """Whether `out` holds only the manifest a capture writes before its first shard (and a killed
    capture's temp files): a capture that failed or was stopped that early, with nothing to keep, so
    a re-run with other settings (the fix its error suggested) starts over instead of being refused."""
    if not (out / st.MANIFEST).is_file():
        return False
    names = {p.name for p in out.iterdir() if p.name != LOCK_NAME and not p.name.endswith(".tmp")
             and not p.name.startswith(".vllm-hidden-")}
    try:
        manifest = json.loads((out / st.MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return (names == {st.MANIFEST} and isinstance(manifest, dict) and manifest.get("shards") == []
            and not manifest.get("complete"))


def _resume_manifest(out: Path, want: dict) -> dict:
    """The existing manifest cut back to its shards that are present and hash-correct, after
    checking it was captured with the same target, layers, dtype, data and shard size."""
    manifest = st.read_manifest(out)
    have_t, want_t = manifest["target"], want["target"]
    if not same_target(have_t.get("fingerprint"), want_t):
        raise SpecdraftError(f"{out}: store was captured from {have_t.get('id')} (fingerprint "
                             f"{have_t.get('fingerprint')}) but --model is {want_t.get('id')} (fingerprint "
                             f"{want_t.get('fingerprint')}); pass the same --model or another --out")
    for key, option in (("layer_ids", "--layers"), ("dtype", "--store-dtype"), ("hidden_size", "--model"),
                        ("store_format", "--store-format"), ("part", "--part"),
                        ("shard_tokens", "--shard-tokens"), ("compute_dtype", "--compute-dtype")):
        have, wanted = manifest.get(key), want.get(key)
        if key == "store_format":   # stores from before formats existed are bf16
            have, wanted = sf.manifest_format(manifest), sf.manifest_format(want)
        if have != wanted:
            shown = ("/".join(map(str, have)) if key == "part" and have else   # as the flag is typed
                     ",".join(map(str, have)) if key == "layer_ids" and isinstance(have, list) else have)
            raise SpecdraftError(f"{out}: store has {key} {json.dumps(have)} but this capture would use "
                                 f"{json.dumps(wanted)}; pass {option} {shown} or another --out")
    have_engine = (manifest.get("engine") or {}).get("name", "transformers")
    if have_engine != want["engine"]["name"]:
        flag = "vllm" if have_engine == "vllm" else "hf"
        raise SpecdraftError(f"{out}: store was captured with {have_engine} but this capture would use "
                             f"{want['engine']['name']}; pass --engine {flag} to resume it or choose another --out")
    if manifest.get("data", {}).get("fingerprint") != want["data"]["fingerprint"]:
        raise SpecdraftError(f"{out}: store was captured from other prepared data than --prepared "
                             f"{want['data']['path']}; pass the same --prepared or another --out")
    return st.resumable(out, manifest)


def _check_disk(out: Path, tokens: int, hidden_size: int, dtype: str, manifest: dict) -> None:
    per_token = st.bytes_per_token(hidden_size, dtype, num_aux=len(manifest["layer_ids"]),
                                   store_format=sf.manifest_format(manifest),
                                   topk=manifest.get("teacher_topk", sf.DEFAULT_TOPK))
    need = tokens * per_token
    free = shutil.disk_usage(out).free
    if need > free:
        store_format, num_aux = sf.manifest_format(manifest), len(manifest["layer_ids"])
        what = (f"{num_aux + 1} x {hidden_size} x {st.STORE_DTYPES[dtype].itemsize} B" if store_format == "bf16" else
                f"{per_token:,} B ({store_format}, {num_aux} aux layers, H={hidden_size})")
        raise SpecdraftError(f"{out}: not enough disk space: {tokens:,} tokens x {what} needs {_size(need)} but only "
                             f"{_size(free)} is free; free space, choose another --out, use a smaller "
                             "--store-format, or use --limit at prepare time")


def top_k_teacher(manifest: dict, target, model: str, device: str, trust_remote_code: bool):
    """The target's head for a compact store (None for the others): the loaded model's own, or for
    a vLLM capture (no weights in this process) its norm and lm_head read from the checkpoint."""
    if sf.manifest_format(manifest) != "compact":
        return None
    head = target.model if target.model is not None else load_target_head(
        model, device=device, trust_remote_code=trust_remote_code).model
    return sf.TopKTeacher.from_model(head, int(manifest["teacher_topk"]))


def _size(n: int) -> str:
    """Bytes for people: 2.30 GB, 404.50 KB (GB alone would print 0.00 for small stores)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def capture(model: str, data: str | Path, out: str | Path, layers: list[int] | None = None,
            dtype: str = "bfloat16", batch_tokens: int = 4096, shard_tokens: int = 65536,
            resume: bool = False, trust_remote_code: bool = False, compute_dtype: str = "float32",
            device: str = "auto", target=None, progress: bool = True, engine="hf",
            store_format: str = sf.DEFAULT_FORMAT, part: tuple[int, int] | None = None) -> dict:
    """Capture the store for prepared `data` into `out`; returns the final manifest.

    `target` may be an already loaded specdraft.targets.Target (benchmarks, online use).
    `engine` is 'hf', 'vllm', 'auto' or a vllm_engine.EngineOptions (tensor parallelism, LLM args).
    `store_format` is how the shards keep the hidden states (data/store_formats.py); `part` (I, N)
    captures only samples I-1, I-1+N, ... so N nodes each capture one part. `device` 'auto' is the
    GPU where there is one (transformers' engine; vLLM places the target itself).
    """
    dtype = st.dtype_name(dtype)
    device = resolve_device(device)
    out = Path(out)
    nothing = check_capture_options(out, store_format, compute_dtype, batch_tokens, shard_tokens, resume)
    opts = engine if isinstance(engine, EngineOptions) else engine_options(engine)
    ds, meta = take_part(*load_prepared(data), part, data)
    lengths, data_fingerprint, max_id = sample_columns(ds)
    compute_dtype = capture_dtype(compute_dtype, out, resume, model, target, trust_remote_code, batch_tokens, device)
    target, engine_name = capture_target(target, opts, model, compute_dtype, device, trust_remote_code)
    check_prepared_for(meta, target, data, "capture")
    if max_id >= target.vocab_size:
        raise SpecdraftError(f"{data}: token id {max_id} is outside the vocabulary of {target.name} "
                             f"({target.vocab_size} tokens); the data was tokenized for another model")
    L = target.num_layers
    layer_ids = check_aux_layers(list(layers) if layers is not None else default_aux_layers(L), L)

    compute_name = str(DTYPES[compute_dtype]).removeprefix("torch.")
    part_record = {"part": list(meta["part"])} if meta.get("part") else {}
    want = st.new_manifest(target.identity, layer_ids, dtype, target.hidden_size, store_format=store_format,
                           shard_tokens=shard_tokens, batch_tokens=batch_tokens, compute_dtype=compute_name,
                           engine=engine_record(engine_name), **part_record,
                           data={"path": str(data), "fingerprint": data_fingerprint,
                                 "num_samples": len(lengths), "num_tokens": sum(lengths)})
    ensure_writable_dir(out)
    manifest, batch_tokens = start_manifest(out, want, resume, nothing, batch_tokens)

    plan = st.plan_shards(lengths, shard_tokens)
    writer = st.StoreWriter(out, manifest, top_k_teacher(manifest, target, model, device, trust_remote_code))
    remaining = sum(lengths[writer.next_sample:])
    _check_disk(out, remaining, target.hidden_size, dtype, manifest)
    with progress_of("capture", sum(lengths), sum(lengths) - remaining, "tokens", enabled=progress) as tracker:
        with hidden_state_engine(engine_name, target, layer_ids, st.STORE_DTYPES[dtype], batch_tokens, compute_name,
                                 opts, max(lengths), out, on_batch=lambda n: tracker.advance(n, tokens=n)) as run_target:
            # The manifest goes down once the engine runs and before the first shard: a capture killed
            # after writing a shard can always be resumed (a shard without a manifest could not be told
            # from a stranger's file), and an engine that fails to start leaves --out as it was.
            writer.save()
            write_shards(writer, ds, plan[writer.next_shard:], run_target)
    writer.save(complete=True)
    return writer.manifest


def check_capture_options(out: Path, store_format: str, compute_dtype: str, batch_tokens: int, shard_tokens: int,
                          resume: bool) -> bool:
    """Refuse bad options and an --out that holds something else; True when --out holds only the
    manifest of a capture that wrote no shard (started over)."""
    sf.check_format(store_format)
    check_compute_dtype(compute_dtype)
    if batch_tokens <= 0:
        raise SpecdraftError(f"--batch-tokens {batch_tokens}: must be positive")
    if shard_tokens <= 0:
        raise SpecdraftError(f"--shard-tokens {shard_tokens}: must be positive")
    if out.exists() and not out.is_dir():
        raise SpecdraftError(f"{out}: exists and is not a directory; pass a folder for --out")
    nothing = nothing_captured(out)
    if out.is_dir() and any(p.name != LOCK_NAME for p in out.iterdir()) and not resume and not nothing:
        raise SpecdraftError(f"{out}: already holds files (a previous capture?); pass --resume to continue "
                             "it or choose another --out")
    return nothing


def capture_dtype(requested: str, out: Path, resume: bool, model: str, target, trust_remote_code: bool,
                  batch_tokens: int, device: str) -> str:
    """--compute-dtype as asked; 'auto' keeps a resumed store's dtype, else dtypes.auto_dtype at a
    batch's rows (bf16 on a GPU; on a CPU bf16 where it measures faster, e.g. with AMX). 512 rows
    already show the ratio that batch_tokens rows would."""
    if requested != "auto":
        return requested
    started = st.read_manifest(out).get("compute_dtype") if resume and (out / "manifest.json").is_file() else None
    if started:
        return started
    loaded = target is not None and target.model is not None
    config = target.model.config if loaded else target_config(model, trust_remote_code)
    return auto_dtype("auto", config, min(batch_tokens, 512), gpu=device.startswith("cuda"))


def capture_target(target, opts: EngineOptions, model: str, compute_dtype: str, device: str,
                   trust_remote_code: bool):
    """(target, engine name): the given target, else one loaded for the engine (vLLM holds the
    weights itself: only config, tokenizer and fingerprint are read here)."""
    if target is not None:
        return target, "hf" if target.model is not None else "vllm"
    engine_name = choose_engine(opts, model, trust_remote_code)
    target = (describe_target(model, trust_remote_code) if engine_name == "vllm" else
              load_target(model, dtype=compute_dtype, device=device, trust_remote_code=trust_remote_code))
    return target, engine_name


def start_manifest(out: Path, want: dict, resume: bool, nothing: bool, batch_tokens: int) -> tuple[dict, int]:
    """(manifest, batch_tokens) the capture writes under: the resumed store's (its batch layout kept,
    so resumed shards stay byte-identical to an uninterrupted run), else this run's."""
    if nothing:
        print(f"note: {out} held only the manifest of a capture that wrote no shard (it failed or was stopped "
              "first); starting over with this run's settings", file=sys.stderr)
    if resume and (out / st.MANIFEST).exists() and not nothing:
        _clean_temp_files(out)
        manifest = _resume_manifest(out, want)
        recorded = int(manifest.get("batch_tokens", batch_tokens))
        if recorded != batch_tokens:
            print(f"note: --batch-tokens {batch_tokens}: {out} was captured with batch_tokens {recorded}, which the "
                  "rest of it keeps (its shards stay byte-identical to an uninterrupted capture)", file=sys.stderr)
        return manifest, recorded
    if resume and not nothing and any(p for p in out.iterdir() if not p.name.endswith(".tmp") and p.name != LOCK_NAME):
        raise SpecdraftError(f"{out}: has files but no {st.MANIFEST}, so there is nothing to resume; "
                             "choose another --out or empty it")
    _clean_temp_files(out)
    return want, batch_tokens


def write_shards(writer, ds, todo: list[tuple[int, int]], run_target) -> None:
    """Run the target over each planned shard's samples and write the shard."""
    for start, end in todo:
        rows = ds[start:end]
        aux, last, offsets = run_target(rows["input_ids"], first_index=start)
        input_ids = torch.tensor([t for s in rows["input_ids"] for t in s], dtype=torch.int64)
        loss_mask = torch.tensor([m for s in rows["loss_mask"] for m in s], dtype=torch.uint8)
        writer.write_shard(aux, last, input_ids, loss_mask, offsets)
        del aux, last


def verify_store(out: str | Path) -> dict:
    """Re-hash every shard and open it; report counts or raise naming the bad shards."""
    out = Path(out)
    manifest = st.read_manifest(out)
    st.verify_shards(out, manifest)
    store = st.HiddenStore(out, allow_incomplete=True)
    for k in range(len(store.shards)):
        store._handle(k)   # opens each shard and checks its offsets against the manifest
    for entry in manifest["shards"]:
        st.check_shard_finite(st.safe_shard_path(out, entry["file"]))
    if not manifest.get("complete", False):
        raise SpecdraftError(f"{out}: the {len(manifest['shards'])} shards written so far are intact but "
                             "the capture did not finish; re-run `specdraft capture --resume`")
    return {"shards": len(manifest["shards"]), "samples": manifest["num_samples"],
            "tokens": manifest["num_tokens"]}
