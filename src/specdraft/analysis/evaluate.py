"""`specdraft eval`: a drafter's acceptance on stored hidden states, in seconds.

It replays training-time test over the store's held-out samples (the run's own validation split when
the drafter comes from a run folder) and reports per-position conditional acceptance and the simulated
acceptance length for every chain length K. `bench` measures the real thing by generating; the two
agree when the prompts match the store's distribution (see docs/recipes.md for the numbers).
"""

from __future__ import annotations

from pathlib import Path

from specdraft import run_layout
from specdraft.analysis.probe import context_masks, drafter_metrics_by_group, part_masks
from specdraft.data.store import HiddenStore
from specdraft.data.store_parts import open_stores
from specdraft.defaults import DRAFT_LENGTH
from specdraft.errors import SpecdraftError
from specdraft.formats.checkpoints import resolve_checkpoint
from specdraft.infer.methods import load_drafter_for
from specdraft.metrics import by_context_section, by_context_text, parse_context_buckets, tau_text
from specdraft.progress import track
from specdraft.targets import load_target, same_target
from specdraft.train.batches import StoreBatches, split_samples
from specdraft.train.inputs import STORE_SEPARATOR


def run_config_of(drafter: Path) -> dict:
    """The training run's config.yaml (train/config.read_run_config) when `drafter` is RUN, RUN/best or
    RUN/checkpoints/epoch-N; {} for a drafter outside a run."""
    from specdraft.train.config import read_run_config

    for folder in (drafter, drafter.parent, drafter.parent.parent):
        cfg = read_run_config(folder)
        if cfg is not None:
            return cfg.to_dict()
    return {}


def trained_store_of(checkpoint: Path) -> tuple[dict, Path | None]:
    """What the run recorded of its training store (data_identity: fingerprint, samples, tokens): the
    checkpoint's inputs.json, else one of its run's checkpoints (a run trains on one store: --resume
    refuses another). ({}, None) for a run from before inputs.json."""
    from specdraft.schemas.inputs import INPUTS_FILE, read_inputs

    candidates = [checkpoint / INPUTS_FILE]
    for folder in (checkpoint, checkpoint.parent, checkpoint.parent.parent):
        if run_layout.config_file(folder).is_file():
            candidates += [c / INPUTS_FILE for _, _, c in run_layout.checkpoints(folder, holding=(INPUTS_FILE,))]
            break
    for path in candidates:
        if path.is_file():
            return read_inputs(path, "restore it from the run, or pass --split all"), path
    return {}, None


def store_mismatch(checkpoint: Path, hidden: HiddenStore, store, run_cfg: dict) -> str | None:
    """Why `store` is not the store the run trained on (None when it is, or when nothing says so)."""
    saved, where = trained_store_of(checkpoint)
    data = hidden.manifest.get("data") if isinstance(hidden.manifest.get("data"), dict) else {}
    now = {"data_fingerprint": data.get("fingerprint", ""), "num_samples": len(hidden),
           "num_tokens": hidden.num_tokens}
    for key in ("data_fingerprint", "num_samples", "num_tokens"):
        was, have = saved.get(key), now[key]
        if was and have and was != have:
            return f"{where} records {key} {was}, {store} has {have}"
    trained = saved.get("store") or run_cfg.get("store")
    if not saved and (not trained or resolved(trained) != resolved(store)):
        return f"the run records no fingerprint of its training store and {store} is not the store its config.yaml names ({trained})"
    return None


def store_names(stores) -> list[str]:
    """A store, several (a list), or their union's name ("A + B") as the list of its stores."""
    return [str(s) for s in stores] if isinstance(stores, list) else str(stores).split(STORE_SEPARATOR)


def resolved(stores) -> list[Path]:
    return [Path(s).resolve() for s in store_names(stores)]


def check_trained_store(checkpoint: Path, hidden: HiddenStore, store, run_cfg: dict) -> None:
    """--split val means the run's held-out samples, which exist only in the store it trained on: on
    another store the same seed and fraction pick samples the run may have trained on."""
    why = store_mismatch(checkpoint, hidden, store, run_cfg)
    if why:
        trained = trained_store_of(checkpoint)[0].get("store") or run_cfg.get("store")
        fix = (f"pass --store {' --store '.join(store_names(trained))} (the run's own, in its order) for its held-out "
               "samples, or --split all")
        raise SpecdraftError(f"--split val: {store} is not the store the run trained on ({why}), so the run's "
                             f"held-out samples are not there; {fix}")


def training_split_of(checkpoint: Path) -> dict:
    """How the drafter's run split the store ({"val_fraction", "seed"}): its run's config.yaml, else
    the inputs.json an export carries ({} where neither says: a drafter of unknown origin)."""
    run_cfg = run_config_of(checkpoint)
    if run_cfg:
        return {"val_fraction": run_cfg.get("val_fraction", 0.05), "seed": run_cfg.get("seed", 0), "run": run_cfg}
    saved, _ = trained_store_of(checkpoint)
    if isinstance(saved.get("val_fraction"), (int, float)) and isinstance(saved.get("seed"), int):
        return {"val_fraction": saved["val_fraction"], "seed": saved["seed"], "run": {}}
    return {}


def eval_samples(checkpoint: Path, hidden: HiddenStore, store, split: str) -> tuple[list[int], str, str, list[str]]:
    """(sample ids, the split as printed, its τ source name, warnings). A drafter whose training
    samples can be identified (a run, an export carrying its run's inputs.json) is evaluated on its
    held-out samples; --split all on it says loudly that τ includes training data; a drafter of
    unknown origin gets a line that the samples may include its training data."""
    ids = list(range(len(hidden)))
    origin = training_split_of(checkpoint)
    if origin and split == "val":
        check_trained_store(checkpoint, hidden, store, origin["run"])
        _, ids = split_samples(len(hidden), origin["val_fraction"], origin["seed"])
        return ids, f"val ({len(ids)} held-out samples of the run)", "held-out", []
    if origin and split == "all" and store_mismatch(checkpoint, hidden, store, origin["run"]):
        # another store (e.g. one captured from the natural set's prompts): nothing in it was trained on
        return ids, f"all ({len(ids)} samples of a store the run did not train on)", "unseen-store", []
    if origin:
        return ids, f"all ({len(ids)} samples)", "all", [
            f"warning: --split all includes the samples the drafter trained on: τ reads higher than on unseen "
            f"data; use --split val for the {len(split_samples(len(hidden), origin['val_fraction'], origin['seed'])[1])} "
            "held-out samples"]
    return ids, f"all ({len(ids)} samples; the drafter's training samples are unknown)", "unknown-origin", [
        f"warning: --drafter {checkpoint}: no run folder and no inputs.json name its training samples, so "
        f"these {len(ids)} samples may include them and τ may read high; evaluate the run folder, or an export "
        "made by `specdraft export` (it carries the run's inputs.json)"]


def chain_accept_lengths(cond_acc: list[float]) -> list[float]:
    """Expected tokens per target forward for chains of K = 0..len(cond_acc) draft tokens."""
    lengths, prod, total = [1.0], 1.0, 1.0
    for a in cond_acc:
        prod *= a
        total += prod
        lengths.append(total)
    return lengths


FEW_SAMPLES = 8   # held-out samples below which eval warns that τ is noise


def evaluate(drafter: str | Path, store: str | Path | list, model: str = "default", split: str = "val",
             steps: int = DRAFT_LENGTH, max_tokens: int = 2048, trust_remote_code: bool = False,
             context_buckets: str | None = None) -> dict:
    if split not in ("val", "all"):
        raise SpecdraftError(f"--split {split}: use val (the run's held-out samples) or all")
    context_edges = parse_context_buckets(context_buckets)   # before any loading: a bad list is one line
    checkpoint = resolve_checkpoint(str(drafter))
    stores = list(store) if isinstance(store, (list, tuple)) else [store]
    hidden = open_stores(stores)             # several: their union, split as train split it
    store = STORE_SEPARATOR.join(map(str, stores))
    target = load_target(model, trust_remote_code=trust_remote_code)
    if not same_target(hidden.target.get("fingerprint"), target.identity):
        raise SpecdraftError(f"{store}: captured from {hidden.target.get('id')} but --model is {target.name} "
                             "(fingerprints differ); pass the store's target")
    net = load_drafter_for(checkpoint, target)
    if list(net.config.aux_layer_ids) != list(hidden.layer_ids):
        raise SpecdraftError(f"--drafter {drafter}: aux layers {net.config.aux_layer_ids} but {store} holds "
                             f"{hidden.layer_ids}; capture with --layers {','.join(map(str, net.config.aux_layer_ids))}")
    ids, split_used, split_name, warnings = eval_samples(Path(checkpoint), hidden, store, split)
    if 0 < len(ids) < FEW_SAMPLES:
        warnings.append(f"warning: τ from {len(ids)} sample(s) is noisy (under {FEW_SAMPLES}); hold out more "
                        "(train --val-fraction, more prepared samples) before comparing drafters")
    if not ids:
        raise SpecdraftError(f"{store}: no samples to evaluate in split {split!r}")
    longest = max(hidden.sample_lengths[i] for i in ids)   # rows never cut a long sample: τ at its far positions
    batches = StoreBatches(hidden, ids, max_tokens=max(max_tokens, longest), shuffle=False)
    shown = track(batches.batches(0), "eval", batches.num_batches(0), "batches",
                  tokens=lambda b: int(b["loss_mask"].numel()))
    chat, thinking = data_chat(hidden, target)

    def groups(batch):
        return ([(("context", i), f, n) for i, f, n in context_masks(batch, context_edges)]
                + ([(("part", p), f, n) for p, f, n in part_masks(batch, chat)] if chat.style else []))

    metrics, grouped = drafter_metrics_by_group(net, target.model, shown, steps, groups)
    per_bucket = [grouped.get(("context", i)) for i in range(len(context_edges) + 1)]
    by_part = {p: {"tau": grouped[("part", p)][0]["accept_len"], "positions": grouped[("part", p)][1]}
               for p in ("reasoning", "answer") if ("part", p) in grouped} or None
    cond = [metrics[f"cond_acc_{k}"] for k in range(steps)]
    by_context = by_context_section([b[0]["accept_len"] if b else None for b in per_bucket],
                                    [b[1] if b else 0 for b in per_bucket], context_edges, steps, "positions")
    return {"drafter": str(checkpoint), "store": str(store), "model": target.name, "split": split_used,
            "k": steps, "samples": len(ids), "split_name": split_name, "cond_acc": cond, "full_acc": [metrics[f"full_acc_{k}"] for k in range(steps)],
            "accept_len": metrics["accept_len"], "accept_len_by_k": chain_accept_lengths(cond),
            "metrics": metrics, "by_context": by_context, "thinking": thinking, "tau_by_part": by_part,
            "warnings": warnings}


def data_chat(hidden, target):
    """The target's chat format with the template arguments of the store's prepared data (its prepare.json),
    and the thinking mode the data was prepared in (None where the data does not record one)."""
    from specdraft.data.prepared import prepared_meta_of
    from specdraft.data.render import Chat

    meta = prepared_meta_of(getattr(hidden, "manifest", None))
    kwargs = meta.get("chat_template_kwargs") if isinstance(meta.get("chat_template_kwargs"), dict) else {}
    thinking = meta.get("thinking") if isinstance(meta.get("thinking"), dict) else None
    return Chat(target.tokenizer, [], kwargs), {**(thinking or {}), "chat_template_kwargs": kwargs} if thinking else None


def format_result(result: dict) -> str:
    """eval's summary for people: τ under its one name, then the per-position rates."""
    rates = " ".join(f"{a:.3f}" for a in result["cond_acc"])
    by_k = " ".join(f"K={k}:{a:.2f}" for k, a in enumerate(result["accept_len_by_k"]) if k)
    source = result.get("split_name", "held-out" if str(result["split"]).startswith("val") else "all")
    return (f"split        {result['split']}\n{tau_text(result['accept_len'], result.get('k'), source, result.get('samples'), 3)}"
            f"   (accept_len: tokens per target forward)\ncond_acc     {rates}\nτ by K       {by_k}"
            + (f"\n{by_context_text(result['by_context'], source, result.get('samples'))}" if result.get("by_context") else "")
            + "".join(f"\nτ by part    {p} {v['tau']:.2f} ({v['positions']} positions)"
                      for p, v in (result.get("tau_by_part") or {}).items()))
