"""A run's inputs: the data (the hidden store by default), the target's head, and the checks that
refuse inputs which do not belong together (store, vocab, target, and on --resume the checkpoint's
own data), each with one line naming both sides."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specdraft.data.store_parts import open_stores
from specdraft.errors import SpecdraftError
from specdraft.schemas.inputs import INPUTS_FILE, read_inputs
from specdraft.targets import load_target, load_target_head, same_target
from specdraft.train.batches import StoreBatches, split_samples
from specdraft.train.config import RunConfig
from specdraft.train.runtime import Runtime, TrainData

if TYPE_CHECKING:
    import torch

STORE_SEPARATOR = " + "      # how a run over several stores (--store A --store B) names its data: "A + B"


def store_data(cfg: RunConfig, runtime: Runtime) -> TrainData:
    """The default data: packed batches from the hidden store (or the union of its parts), split by sample."""
    store = open_stores(cfg.stores)
    train_ids, val_ids = split_samples(len(store), cfg.val_fraction, cfg.seed)
    common = dict(max_tokens=cfg.max_tokens, rows_per_batch=cfg.rows_per_batch, seed=cfg.seed,
                  rank=runtime.rank, world_size=runtime.world_size)
    train = StoreBatches(store, train_ids, shuffle=True, **common)
    val = StoreBatches(store, val_ids, shuffle=False, **common) if val_ids else None
    data = store.manifest.get("data") if isinstance(store.manifest.get("data"), dict) else {}
    identity = {"data_fingerprint": data.get("fingerprint", ""), "num_samples": len(store),
                "num_tokens": store.num_tokens, "store_format": store.store_format}
    return TrainData(train, val, store.hidden_size, store.layer_ids, store.target, STORE_SEPARATOR.join(cfg.stores),
                     identity)


def training_target(cfg: RunConfig):
    """Training reads the target's embeddings, final norm and lm_head, never its layers (the store
    holds what they compute): load those alone where the checkpoint names them the Llama way, so a
    1T-parameter target costs a few GB here, not the whole model; anything else loads whole."""
    try:
        return load_target_head(cfg.model, trust_remote_code=cfg.trust_remote_code)
    except SpecdraftError:
        return load_target(cfg.model, trust_remote_code=cfg.trust_remote_code)


def check_inputs(cfg: RunConfig, data: TrainData, target, vocab) -> None:
    """Refuse mismatched inputs with one line naming both sides and their numbers."""
    if data.hidden_size != target.hidden_size:
        raise SpecdraftError(f"hidden size: store {data.source} has H={data.hidden_size} but target "
                             f"{target.name} has H={target.hidden_size}; capture the store with --model {cfg.model}")
    if vocab.target_vocab_size != target.vocab_size:
        raise SpecdraftError(f"vocab size: {cfg.vocab} is for a target vocab of {vocab.target_vocab_size} tokens but "
                             f"target {target.name} has {target.vocab_size}; build it with `specdraft vocab build "
                             f"--model {cfg.model}`")
    store_fp = str(data.target.get("fingerprint", ""))
    vocab_fp = str(vocab.meta.get("fingerprint", ""))
    target_fp = str(target.identity.get("fingerprint", ""))
    # each against the target (an output made before fingerprint version 2 recorded the older kind)
    if store_fp and target_fp and not same_target(store_fp, target.identity):
        raise SpecdraftError(f"target fingerprint: store {data.source} was captured from "
                             f"{data.target.get('id')} ({store_fp}) but --model {cfg.model} is {target_fp}; "
                             "train with the target the store was captured from")
    if vocab_fp and target_fp and not same_target(vocab_fp, target.identity):
        raise SpecdraftError(f"target fingerprint: store {data.source} was captured from "
                             f"{data.target.get('id')} ({store_fp}) but {cfg.vocab} was built for "
                             f"{vocab.meta.get('target_id') or 'another target'} ({vocab_fp}); rebuild the vocab from this store")




def data_identity(data: TrainData) -> dict:
    """What a checkpoint records of its training data, so that --resume can refuse other data."""
    return {"store": data.source, "layer_ids": list(data.layer_ids), "hidden_size": data.hidden_size,
            "target": {"id": data.target.get("id", ""), "fingerprint": data.target.get("fingerprint", "")},
            **data.identity}


def check_resume_inputs(resume_from: Path, drafter: "torch.nn.Module", data: TrainData) -> None:
    """--resume continues the run on the data it started with: another store (other aux layers, target
    or samples) would train on it while every checkpoint still names the old layers. Checkpoints
    written before inputs.json existed are checked on their aux layers alone."""
    saved = read_inputs(resume_from / INPUTS_FILE, f"the checkpoint is damaged; delete {resume_from} to resume "
                        "from the checkpoint before it")
    run_store = saved.get("store") or "the run's own store (see its config.yaml)"
    fix = f"resume with --store {run_store}, or start a new run in another --out"
    layers = list(drafter.config.aux_layer_ids)
    if layers and layers != list(data.layer_ids):
        raise SpecdraftError(f"aux layers: checkpoint {resume_from} was trained on layers {layers} but --store "
                             f"{data.source} holds layers {list(data.layer_ids)}; {fix}")
    now = data_identity(data)
    for key, what in (("target", "target"), ("data_fingerprint", "prepared data"),
                      ("num_samples", "sample count"), ("num_tokens", "token count")):
        was, have = saved.get(key), now.get(key)
        if key == "target":
            was, have = (was or {}).get("fingerprint"), have.get("fingerprint")
        if was and have and was != have:
            raise SpecdraftError(f"{what}: checkpoint {resume_from} was trained on store {saved.get('store')} "
                                 f"({key} {was}) but --store {data.source} has {key} {have}; {fix}")
    # hidden states of another store format (fp8, compact: other values, another teacher) would be mixed
    # into the run silently; checkpoints from before the field was recorded are not checked
    was, have = saved.get("store_format"), now.get("store_format")
    if was and have and was != have:
        online = str(saved.get("store", "")).endswith("(online)")
        again = (f"resume with --online --store-format {was}" if online else
                 f"resume with a {was} store (--store {run_store}), or start a new run in another --out")
        raise SpecdraftError(f"store format: checkpoint {resume_from} was trained on {was} hidden states "
                             f"({saved.get('store')}) but this run's are {have} ({data.source}); {again}")
