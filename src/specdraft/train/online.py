"""Online training: the target computes the hidden states inside the training loop, nothing is
written to disk (`--online --model M --prepared WS/data`).

A store is ~57 KB per token for a 7168-wide target; online mode trades that disk for one target
forward per batch. It produces exactly the batch dicts of the store path, so the loss and the
metrics are the same:

- `OnlineSamples` looks like a HiddenStore (len, sample_lengths, hidden_size, layer_ids, target,
  dtype, [i] -> input_ids/loss_mask/aux/last) but runs the target instead of reading shards,
  through capture's own `capture_samples` (its hooks are targets.tap_hidden_states: aux = input
  of decoder layer l, HF output_hidden_states[l]; last = the last decoder layer's output before
  the final norm).
- `OnlineBatches` is train/batches.StoreBatches (same packing, rank sharding, resume positions)
  whose batch fetch first runs the target once over all samples of the batch (length-bucketed, right-
  padded), then packs them exactly as the store path does.

Samples are cut to max_tokens before the forward: attention is causal, so the hidden states of
the kept prefix are the ones of the full sample.

With `--engine vllm` the hidden states come from a vLLM engine started once for the run
(data.vllm_engine: extract_hidden_states), not from hooks in this process, which loads only what
the loop needs of the target (targets.TargetHead: embeddings, final norm, lm_head); the batches
are the same.

`--store-format fp8|compact` passes each batch's hidden states through that store format's encoding
and decoding (data/store_formats.py), so an online run trains on what a store of that format holds.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch

from specdraft.data import store_formats as sf
from specdraft.data.capture import capture_samples, hidden_state_engine, sample_columns
from specdraft.data.prepared import check_prepared_for, load_prepared
from specdraft.data.vllm_engine import choose_engine
from specdraft.errors import SpecdraftError
from specdraft.targets import check_aux_layers, default_aux_layers, load_target, load_target_head
from specdraft.train.batches import StoreBatches, split_samples
from specdraft.train.runtime import TrainData


class OnlineSamples:
    """Prepared samples whose aux/last hidden states come from the target on demand."""

    def __init__(self, target, input_ids: list[list[int]], loss_mask: list[list[int]], layer_ids: list[int],
                 max_tokens: int | None = None, batch_tokens: int = 8192, dtype: torch.dtype = torch.float32,
                 store_format: str = sf.DEFAULT_FORMAT):
        self.target = target.identity
        # what a store of that format records (decoding reads it) and, for compact, the target's head
        self.format = {"hidden_size": target.hidden_size, "layer_ids": list(layer_ids), "dtype": "float32",
                       **sf.format_fields(store_format, target.hidden_size)}
        self.teacher = sf.TopKTeacher.from_model(target.model) if store_format == "compact" else None
        self.teacher_topk = self.teacher.k if self.teacher else 0
        self.model = target.model
        self.layer_ids = list(layer_ids)
        self.hidden_size = target.hidden_size
        self.dtype = dtype
        self.batch_tokens = batch_tokens
        cut = (lambda s: s[:max_tokens]) if max_tokens else (lambda s: s)
        self.input_ids = [cut(list(s)) for s in input_ids]
        self.loss_mask = [cut(list(m)) for m in loss_mask]
        self.sample_lengths = [len(s) for s in self.input_ids]
        self.run_target = None         # samples -> (aux, last, offsets) from vLLM (start_vllm); None = hooks here
        self._engine = ExitStack()     # holds a vLLM engine started by start_vllm()
        self._ready: dict[int, dict[str, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.input_ids)

    def prefetch(self, ids: list[int]) -> None:
        """One target pass (length-bucketed batches) over samples `ids`; results kept until clear()."""
        ids = [i for i in dict.fromkeys(ids) if i not in self._ready]
        if not ids:
            return
        samples = [self.input_ids[i] for i in ids]
        if self.run_target is not None:
            aux, last, offsets = self.run_target(samples)                            # [N,3,H], [N,H], [S+1]
        else:
            aux, last, offsets = capture_samples(self.model, samples, self.layer_ids, self.dtype,
                                                 self.batch_tokens)                  # [N,3,H], [N,H], [S+1]
        stored = sf.encode(self.format, aux, last, self.dtype, self.teacher)
        for k, i in enumerate(ids):
            a, b = int(offsets[k]), int(offsets[k + 1])
            self._ready[i] = {"input_ids": torch.tensor(self.input_ids[i], dtype=torch.long),
                              "loss_mask": torch.tensor(self.loss_mask[i], dtype=torch.uint8),
                              **sf.decode(self.format, lambda name: stored[name][a:b], self.dtype)}

    def clear(self) -> None:
        self._ready.clear()

    def start_vllm(self, target, engine) -> None:
        """Run the target in a vLLM capture engine (EngineOptions `engine`) until close() or exit."""
        import atexit
        import tempfile

        dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
        atexit.register(self.close)   # stops the engine and removes its scratch folder
        self.run_target = self._engine.enter_context(hidden_state_engine(
            "vllm", target, self.layer_ids, torch.float32, 0, dtype, engine, max(self.sample_lengths),
            Path(tempfile.gettempdir())))

    def close(self) -> None:
        self._engine.close()
        self.run_target = None

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i not in self._ready:
            self.prefetch([i])
        return self._ready[i]


class OnlineBatches(StoreBatches):
    """StoreBatches over OnlineSamples: the same rows, ranks and resume positions, with one target
    forward per batch instead of reads from the store."""

    def __getitems__(self, rows: list[list[int]]) -> list[dict[str, torch.Tensor]]:
        """The DataLoader's fetch of one batch: all its samples in one target pass, then packed."""
        self.store.prefetch([s for row in rows for s in row])
        try:
            return [self[row] for row in rows]
        finally:
            self.store.clear()


def online_samples(target, data: str | Path, layer_ids: list[int] | None = None,
                   max_tokens: int | None = None, engine=None, store_format: str = sf.DEFAULT_FORMAT) -> OnlineSamples:
    """Load prepared data (WS/data) for `target`, refusing data prepared for another target.

    `engine` (vllm_engine.EngineOptions) runs the target in a vLLM engine started here for the
    life of this process; None runs it with hooks on target.model."""
    ds, meta = load_prepared(data)
    check_prepared_for(meta, target, data, "train online")
    L = target.num_layers
    layer_ids = check_aux_layers(list(layer_ids) if layer_ids is not None else default_aux_layers(L), L)
    columns = ds.select_columns(["input_ids", "loss_mask"])[:]
    if not columns["input_ids"]:
        raise SpecdraftError(f"{data}: no samples; re-run `specdraft prepare`")
    max_id = max(max(s) for s in columns["input_ids"] if s)
    if max_id >= target.vocab_size:
        raise SpecdraftError(f"{data}: token id {max_id} is outside the vocabulary of {target.name} "
                             f"({target.vocab_size} tokens); the data was tokenized for another model")
    samples = OnlineSamples(target, columns["input_ids"], columns["loss_mask"], layer_ids, max_tokens=max_tokens,
                            store_format=store_format)
    if engine is not None:
        samples.start_vllm(target, engine)
    return samples


def online_data(cfg, runtime, target, data: str | Path, layer_ids: list[int] | None = None, engine=None,
                store_format: str = sf.DEFAULT_FORMAT):
    """The loop's TrainData for online mode: the same split, packing and rank sharding as
    train.loop.store_data, over prepared samples run through `target` (or `engine`, vLLM)."""
    samples = online_samples(target, data, layer_ids, max_tokens=cfg.max_tokens, engine=engine,
                             store_format=store_format)
    train_ids, val_ids = split_samples(len(samples), cfg.val_fraction, cfg.seed)
    common = dict(max_tokens=cfg.max_tokens, rows_per_batch=cfg.rows_per_batch, seed=cfg.seed,
                  rank=runtime.rank, world_size=runtime.world_size)
    train = OnlineBatches(samples, train_ids, shuffle=True, **common)
    val = OnlineBatches(samples, val_ids, shuffle=False, **common) if val_ids else None
    # what a checkpoint records, as the store path does: --resume refuses other data or another --store-format
    identity = {"data_fingerprint": sample_columns(load_prepared(data)[0])[1], "num_samples": len(samples),
                "store_format": store_format}
    return TrainData(train, val, samples.hidden_size, samples.layer_ids, samples.target, f"{data} (online)", identity)


def online_setup(data: str | Path | None, engine=None, store_format: str = sf.DEFAULT_FORMAT):
    """For `--online --prepared WS/data`: a function (cfg, runtime) -> train() keyword arguments, the
    target loaded once on this rank's device (teacher head, embeddings and hidden states) and the
    online TrainData. `engine` (vllm_engine.EngineOptions) may move the hidden states to vLLM."""
    if not data:
        raise SpecdraftError("--online: pass --prepared WS/data (the prepared data the target runs over)")
    sf.check_format(store_format)

    def setup(cfg, runtime) -> dict:
        use_vllm = engine is not None and choose_engine(engine, cfg.model, cfg.trust_remote_code) == "vllm"
        if use_vllm and runtime.world_size > 1:
            raise SpecdraftError("--online --engine vllm: one training process drives the engine; use --nproc 1 "
                                 "(vLLM parallelises the target with --tensor-parallel-size)")
        # with vLLM holding the target, this process needs only its embeddings, final norm and lm_head
        load = load_target_head if use_vllm else load_target
        target = load(cfg.model, device=str(runtime.device), trust_remote_code=cfg.trust_remote_code)
        return {"target": target, "data": online_data(cfg, runtime, target, data, engine=engine if use_vllm else None,
                                                      store_format=store_format)}
    return setup
