"""The training recipe: checks, drafter (fresh, from a pretrained one with vocab remap, or resumed),
AdamW with warm-up + cosine/linear decay, TTT steps, validation, metrics.jsonl, checkpoints.

Reads top to bottom in `train()`. What distributed or online training swaps in is a `Runtime`
(rank, world size, device, how metric sums are all-reduced, how the objective is wrapped) and a
`TrainData` (where batches come from); the defaults are one process reading the hidden store.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol

import torch

from specdraft.errors import SpecdraftError
from specdraft.metrics import MetricsLog, load_run
from specdraft.model.config import DrafterConfig
from specdraft.model.drafter import Eagle3Drafter, load_drafter
from specdraft.train import checkpoint as ckpt
from specdraft.train.config import RunConfig, save_yaml
from specdraft.train.distributed import replicated
from specdraft.train.objective import TeacherHead, TTTObjective, add_sums, finalize_metrics


# ----------------------------------------------------------------------------- plug-in points

@dataclass
class Runtime:
    """One process by default; train/distributed.py fills in the rest."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    reduce_sums: Callable[[dict], dict] = lambda sums: sums          # all_reduce(SUM) of metric sums
    wrap_model: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m   # DDP / FSDP
    barrier: Callable[[], None] = lambda: None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class Batches(Protocol):
    def num_batches(self, epoch: int) -> int: ...
    def batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, torch.Tensor]]: ...


@dataclass
class TrainData:
    """Where batches come from: this rank's train and validation batches, and what produced them."""

    train: Batches
    val: Batches | None
    hidden_size: int
    layer_ids: list[int]
    target: dict                        # identity of the target the hidden states came from
    source: str = ""                    # for messages (the store path)
    identity: dict = field(default_factory=dict)   # what checkpoints record of the data (data_identity)


def store_data(cfg: RunConfig, runtime: Runtime) -> TrainData:
    """The default data: packed batches from the hidden store, split by sample."""
    from specdraft.data.store import HiddenStore
    from specdraft.train.batches import StoreBatches, split_samples

    store = HiddenStore(cfg.store)
    train_ids, val_ids = split_samples(len(store), cfg.val_fraction, cfg.seed)
    common = dict(max_tokens=cfg.max_tokens, rows_per_batch=cfg.rows_per_batch, seed=cfg.seed,
                  rank=runtime.rank, world_size=runtime.world_size)
    train = StoreBatches(store, train_ids, shuffle=True, **common)
    val = StoreBatches(store, val_ids, shuffle=False, **common) if val_ids else None
    data = store.manifest.get("data") if isinstance(store.manifest.get("data"), dict) else {}
    identity = {"data_fingerprint": data.get("fingerprint", ""), "num_samples": len(store),
                "num_tokens": store.num_tokens}
    return TrainData(train, val, store.hidden_size, store.layer_ids, store.target, str(cfg.store), identity)


# ----------------------------------------------------------------------------- checks

def training_target(cfg: RunConfig):
    """Training reads the target's embeddings, final norm and lm_head, never its layers (the store
    holds what they compute): load those alone where the checkpoint names them the Llama way, so a
    1T-parameter target costs a few GB here, not the whole model; anything else loads whole."""
    from specdraft.targets import load_target, load_target_head

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
    if store_fp and vocab_fp and store_fp != vocab_fp:
        raise SpecdraftError(f"target fingerprint: store {data.source} was captured from "
                             f"{data.target.get('id')} ({store_fp}) but {cfg.vocab} was built for "
                             f"{vocab.meta.get('target_id') or 'another target'} ({vocab_fp}); rebuild the vocab from this store")
    target_fp = str(target.identity.get("fingerprint", ""))
    if store_fp and target_fp and store_fp != target_fp:
        raise SpecdraftError(f"target fingerprint: store {data.source} was captured from "
                             f"{data.target.get('id')} ({store_fp}) but --model {cfg.model} is {target_fp}; "
                             "train with the target the store was captured from")


INPUTS_FILE = "inputs.json"   # in each training checkpoint: the data it trained on (data_identity)


def data_identity(data: TrainData) -> dict:
    """What a checkpoint records of its training data, so that --resume can refuse other data."""
    return {"store": data.source, "layer_ids": list(data.layer_ids), "hidden_size": data.hidden_size,
            "target": {"id": data.target.get("id", ""), "fingerprint": data.target.get("fingerprint", "")},
            **data.identity}


def check_resume_inputs(resume_from: Path, drafter: Eagle3Drafter, data: TrainData) -> None:
    """--resume continues the run on the data it started with: another store (other aux layers, target
    or samples) would train on it while every checkpoint still names the old layers. Checkpoints
    written before inputs.json existed are checked on their aux layers alone."""
    from specdraft.io import read_json

    saved_path = resume_from / INPUTS_FILE
    saved = read_json(saved_path, "checkpoint inputs") if saved_path.is_file() else {}
    saved = saved if isinstance(saved, dict) else {}
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


# ----------------------------------------------------------------------------- the drafter

def fresh_drafter(cfg: RunConfig, target, vocab, layer_ids: list[int]) -> Eagle3Drafter:
    torch.manual_seed(cfg.seed)
    dcfg = DrafterConfig.from_target(target.config, draft_vocab_size=vocab.draft_vocab_size,
                                     aux_layer_ids=layer_ids, verifier=target.name,
                                     norm_before_residual=cfg.norm_before_residual)
    drafter = Eagle3Drafter(dcfg)
    drafter.init_from_target(target.model, vocab.d2t, vocab.t2d)
    return drafter


def pretrained_drafter(cfg: RunConfig, target, vocab, layer_ids: list[int], log) -> tuple[Eagle3Drafter, dict]:
    """Load --from-pretrained; move its lm_head rows to the run's vocab when the mappings differ."""
    from specdraft import vocab as vocab_mod

    src = load_drafter(cfg.from_pretrained)
    where = f"--from-pretrained {cfg.from_pretrained}"
    if src.config.hidden_size != target.hidden_size:
        raise SpecdraftError(f"hidden size: {where} has H={src.config.hidden_size} but target {target.name} "
                             f"has H={target.hidden_size}; train from scratch for this target")
    if src.config.vocab_size != target.vocab_size:
        raise SpecdraftError(f"vocab size: {where} embeds {src.config.vocab_size} target tokens but target "
                             f"{target.name} has {target.vocab_size}; the drafter belongs to another tokenizer")
    report = {"from_pretrained": str(cfg.from_pretrained), "remapped": False}
    src_vocab = vocab_mod.Vocab(src.d2t.clone(), src.t2d.clone(), {"source": str(cfg.from_pretrained)})
    same = (src_vocab.draft_vocab_size == vocab.draft_vocab_size and torch.equal(src_vocab.d2t, vocab.d2t))
    dcfg = DrafterConfig.from_dict({**src.config.to_dict(), "draft_vocab_size": vocab.draft_vocab_size,
                                    "aux_layer_ids": list(layer_ids), "verifier": target.name})
    drafter = Eagle3Drafter(dcfg)
    tensors = ckpt.drafter_tensors(src)
    if not same:
        d = vocab_mod.diff(src_vocab, vocab)
        numbers = (f"token overlap {d['overlap']['count']}/{vocab.draft_vocab_size}, positional matches "
                   f"{d['positional_matches']['count']}/{vocab.draft_vocab_size}")
        if not cfg.remap:
            raise SpecdraftError(f"draft vocab: {where} and --vocab {cfg.vocab} map draft ids differently "
                                 f"({numbers}); pass --remap to move the lm_head rows, or train with the "
                                 "drafter's own mapping")
        target_rows = target.model.get_output_embeddings().weight.detach().float()
        weight, counts = vocab_mod.remap_lm_head(src.lm_head.weight.detach(), src_vocab, vocab, target_rows)
        tensors["lm_head.weight"] = weight
        report.update(remapped=True, overlap=d["overlap"]["count"],
                      positional_matches=d["positional_matches"]["count"], **counts)
        log(f"remapped lm_head to {cfg.vocab}: {numbers}; rows carried {counts['carried']}, "
            f"from the target's lm_head {counts['from_target']}, zero {counts['zeros']}")
    tensors["d2t"], tensors["t2d"] = vocab.d2t.clone(), vocab.t2d.clone()
    if dcfg.tie_embeddings_to_target:   # the frozen embeddings are the (new) target's
        tensors["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().float()
    drafter.load_state_dict(tensors, strict=False)
    if list(src.config.aux_layer_ids) != list(layer_ids):
        log(f"note: {where} was trained on aux layers {src.config.aux_layer_ids}; the store has {layer_ids}")
    return drafter.float().train(), report


# ----------------------------------------------------------------------------- schedule

def lr_lambda(cfg: RunConfig, total_steps: int) -> Callable[[int], float]:
    """Linear warm-up to lr, then cosine/linear decay to lr * min_lr_ratio (or constant)."""
    warmup = max(0, min(cfg.warmup_steps, total_steps - 1))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup - 1))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return factor


def use_bf16(cfg: RunConfig, device: torch.device) -> bool:
    """bf16 autocast where the hardware does it natively; without AVX512-BF16/AMX a CPU runs bf16
    matmuls an order of magnitude slower than fp32."""
    if cfg.precision != "auto":
        return cfg.precision == "bf16"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


# ----------------------------------------------------------------------------- the loop

def evaluate(model: torch.nn.Module, batches: Batches, runtime: Runtime, bf16: bool) -> dict:
    model.eval()
    sums = None
    with torch.no_grad(), torch.autocast(runtime.device.type, dtype=torch.bfloat16, enabled=bf16):
        for batch in batches.batches(0):
            batch = {k: v.to(runtime.device) for k, v in batch.items()}
            sums = add_sums(sums, model(batch)[1])
    model.train()
    return finalize_metrics(runtime.reduce_sums(sums)) if sums is not None else {}


# what `train` writes in RUN: --overwrite deletes these; the first four mean "RUN already holds a run"
RUN_FILES = ("metrics.jsonl", "config.yaml", "checkpoints", "best", "remap.json", "journal.md", "tensorboard")


def train(cfg: RunConfig, runtime: Runtime | None = None, data: TrainData | None = None,
          target=None) -> dict:
    """Run (or resume) training as configured; returns a summary (steps, tokens, last val metrics)."""
    cfg.check()
    runtime = runtime or Runtime()
    with own_run_folder(cfg, runtime):
        return _train(cfg, runtime, data, target)


@contextlib.contextmanager
def own_run_folder(cfg: RunConfig, runtime: Runtime):
    """Rank 0 locks RUN for the whole run (a second train into it fails at once) and refuses a
    folder that already holds a run unless --resume or --overwrite. Collective: every rank learns
    the outcome, so no rank waits in a collective for a rank 0 that gave up."""
    from specdraft.io import own_folder

    with contextlib.ExitStack() as held:
        error = None
        if runtime.is_main:
            try:
                held.enter_context(own_folder(cfg.out, "train"))
                check_run_folder(cfg)
            except SpecdraftError as e:
                error = e
        if any_rank(runtime, error is not None):
            raise error or SpecdraftError(f"{cfg.out}: refused by rank 0 (its message says why)")
        yield


def check_run_folder(cfg: RunConfig) -> None:
    """Training into a finished or running run without --resume used to empty its metrics,
    replace best/ and keep its later checkpoints: two runs mixed in one folder."""
    run_dir = Path(cfg.out)
    held = [name + ("/" if (run_dir / name).is_dir() else "") for name in RUN_FILES[:4] if (run_dir / name).exists()]
    if held and not (cfg.resume or cfg.overwrite):
        raise SpecdraftError(f"{run_dir}: already holds a run ({', '.join(held)}); pass --resume to continue it, "
                             "--overwrite to start over, or choose another --out")


def wipe_run(run_dir: Path, log) -> None:
    """--overwrite: delete what an earlier train wrote in RUN, so the folder holds one run only."""
    removed = []
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    if removed:
        log(f"--overwrite: deleted the previous run's {', '.join(removed)}")


def _train(cfg: RunConfig, runtime: Runtime, data: TrainData | None, target) -> dict:
    from rich.console import Console

    from specdraft import vocab as vocab_mod

    if cfg.attention == "flex" and runtime.device.type != "cuda":
        raise SpecdraftError("--attention flex: needs a CUDA device (flex attention compiles for GPUs); "
                             "use --attention sdpa on CPU")
    console = Console(stderr=True)
    log = (lambda msg: console.print(msg, highlight=False)) if runtime.is_main else (lambda msg: None)
    run_dir = Path(cfg.out)

    # -- inputs and checks
    resume_from = None
    if cfg.resume:
        resume_from = ckpt.latest_checkpoint(run_dir)
        if resume_from is None:
            raise SpecdraftError(f"{run_dir}: no checkpoint to resume from (checkpoints/epoch-N or step-N "
                                 "with trainer_state.pt); start without --resume")
    vocab = vocab_mod.load(cfg.vocab)
    data = data or store_data(cfg, runtime)
    target = target or training_target(cfg)
    check_inputs(cfg, data, target, vocab)
    watch = load_watch(cfg, run_dir) if cfg.baseline else None

    # -- the drafter and the teacher
    remap_report = None
    if resume_from is not None:
        drafter = load_drafter(resume_from).train()
        if not torch.equal(drafter.d2t, vocab.d2t):
            raise SpecdraftError(f"draft vocab: checkpoint {resume_from} was trained with another mapping than "
                                 f"--vocab {cfg.vocab}; resume with the run's own vocab")
        check_resume_inputs(resume_from, drafter, data)
        log(f"resuming from {resume_from}")
    elif cfg.from_pretrained:
        drafter, remap_report = pretrained_drafter(cfg, target, vocab, data.layer_ids, log)
    else:
        drafter = fresh_drafter(cfg, target, vocab, data.layer_ids)
    drafter.to(runtime.device).train()
    teacher = TeacherHead.from_target(target.model, vocab.d2t).to(runtime.device)
    objective = TTTObjective(drafter, teacher, cfg.ttt_steps, cfg.step_decay, cfg.loss, cfg.aux_noise,
                             cfg.attention)
    model = runtime.wrap_model(objective)
    bf16 = use_bf16(cfg, runtime.device)

    # -- optimizer and schedule over the whole run
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    batches_per_epoch = [data.train.num_batches(e) for e in range(cfg.epochs)]
    total_steps = sum(batches_per_epoch)
    if total_steps == 0:
        raise SpecdraftError(f"{data.source}: no training samples (val_fraction {cfg.val_fraction} took them all?)")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_steps))

    # -- state (restored on resume)
    state = {"epoch": 0, "batch": 0, "step": 0, "tokens_seen": 0, "best_val": float("inf"), "window": None}
    if resume_from is not None:
        saved = ckpt.load_trainer_state(resume_from)
        ckpt.load_optimizer_state(drafter, optimizer, saved["optimizer"])   # collective under FSDP2
        scheduler.load_state_dict(saved["scheduler"])
        ckpt.set_rng_state(saved["rng"])
        state.update({k: saved[k] for k in ("epoch", "batch", "step", "tokens_seen", "best_val", "window")})
    if runtime.is_main and cfg.overwrite:   # every input check passed: only now delete the old run
        wipe_run(run_dir, log)
    metrics_log = MetricsLog(run_dir, runtime.is_main, cfg.tensorboard, console)
    if runtime.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_yaml(cfg.replace(overwrite=False), run_dir / "config.yaml")   # a --resume of it must not wipe
        if remap_report is not None:
            from specdraft.io import write_json
            write_json(run_dir / "remap.json", remap_report)
        metrics_log.truncate_after(state["step"])
    log(f"training {sum(p.numel() for p in params):,} parameters, {total_steps} steps, "
        f"TTT {cfg.ttt_steps}, {'bf16 autocast' if bf16 else 'fp32'} -> {run_dir}")
    if watch is not None and resume_from is not None:
        replay_run(watch, run_dir, log)
    if runtime.is_main:
        note(run_dir, "decision", start_summary(cfg, resume_from, remap_report, total_steps, state))

    def record(split: str, metrics: dict, lr: float, **extra) -> bool:
        """Log one record and feed it to the baseline watch (rank 0). Collective when a baseline is
        set: returns True on every rank once the watch fired and --stop-if-behind asks to stop."""
        rec = {"split": split, "epoch": state["epoch"], "step": state["step"],
               "tokens_seen": state["tokens_seen"], "lr": lr, "metrics": metrics, **extra}
        metrics_log.write(rec)
        if watch is None:
            return False
        fired = runtime.is_main and watch.check(rec, run_dir)
        if fired:
            log(f"[yellow]watch:[/] {watch.verdict.message}")
        return any_rank(runtime, fired and cfg.stop_if_behind)

    def stop_behind(folder: Path) -> dict:
        """--stop-if-behind fired: the checkpoint in `folder` is written; say so and where."""
        text = (f"stopped at step {state['step']} ({state['tokens_seen']:,} tokens) by --stop-if-behind: "
                f"behind baseline {cfg.baseline}; checkpoint {folder} (inspect it, or continue with "
                f"`specdraft train --out {run_dir} --resume`)")
        log(f"[yellow]{text}[/]")
        if runtime.is_main:
            note(run_dir, "decision", text)
        return {"steps": state["step"], "tokens_seen": state["tokens_seen"], "val": last_val,
                "best_val_loss": state["best_val"], "stopped": "behind baseline", "checkpoint": str(folder)}

    def save(folder: Path, val: dict | None = None) -> None:
        """Collective: every rank calls it (FSDP2 gathers the shards here); rank 0 writes."""
        tensors, optimizer_state = ckpt.training_state(drafter, optimizer)
        trainer_state = {"optimizer": optimizer_state, "scheduler": scheduler.state_dict(),
                         "rng": ckpt.rng_state(), **state}
        progress = {k: state[k] for k in ("epoch", "batch", "step", "tokens_seen")}
        extra = {ckpt.PROGRESS_FILE: progress, INPUTS_FILE: data_identity(data)}
        if val:
            extra["val.json"] = val
        if runtime.is_main:
            ckpt.save(folder, drafter, trainer_state, extra, tensors=tensors)
        runtime.barrier()

    steps_this_run = 0
    last_val: dict = {}
    with _progress(cfg.progress and runtime.is_main, total_steps, state["step"]) as bar:
        for epoch in range(state["epoch"], cfg.epochs):
            state["epoch"] = epoch
            epoch_start, epoch_tokens = time.perf_counter(), 0
            train_sums, stop = None, False
            for b, batch in enumerate(data.train.batches(epoch, state["batch"]), state["batch"]):
                batch = {k: v.to(runtime.device) for k, v in batch.items()}
                if cfg.train_on_prompts:   # the target's distribution is the teacher at prompt tokens too
                    batch["loss_mask"] = torch.ones_like(batch["loss_mask"])
                lr = optimizer.param_groups[0]["lr"]
                with torch.autocast(runtime.device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss, sums = model(batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
                grad_norm = replicated(grad_norm)    # FSDP2 returns a DTensor; a plain tensor stays as is
                # collective: a NaN on one rank stops every rank here, before the weights change
                # (backward ran everywhere, so no rank waits in DDP's gradient all_reduce)
                bad = runtime.reduce_sums({"loss": (~torch.isfinite(loss.detach())).double(),
                                           "grad_norm": (~torch.isfinite(grad_norm.detach())).double()})
                if float(bad["loss"]) or float(bad["grad_norm"]):
                    what, value = ("loss", loss) if float(bad["loss"]) else ("gradient norm", grad_norm)
                    error = _nan_error(what, value, int(float(bad[what.replace(" ", "_")])), runtime.world_size,
                                       state, epoch, b, run_dir)
                    if runtime.is_main:
                        note(run_dir, "warning", str(error))
                    raise error
                optimizer.step()
                scheduler.step()

                tokens = int(runtime.reduce_sums({"tokens": (batch["doc_ids"] >= 0).sum().double()})["tokens"])
                state["step"] += 1
                state["batch"] = b + 1
                state["tokens_seen"] += tokens
                epoch_tokens += tokens
                steps_this_run += 1
                state["window"] = add_sums(state["window"], sums)
                train_sums = add_sums(train_sums, sums)
                bar(tokens)
                last_of_epoch = b + 1 == batches_per_epoch[epoch]
                stop = False
                if state["step"] % cfg.log_every == 0 or last_of_epoch:
                    stop = record("train", finalize_metrics(runtime.reduce_sums(state["window"])), lr,
                                  grad_norm=float(grad_norm))
                    state["window"] = None
                if cfg.val_every and state["step"] % cfg.val_every == 0 and data.val is not None and not last_of_epoch:
                    stop = record("val", evaluate(model, data.val, runtime, bf16), lr) or stop
                if cfg.save_every and state["step"] % cfg.save_every == 0 and not last_of_epoch:
                    save(run_dir / "checkpoints" / f"step-{state['step']}")
                    if runtime.is_main:
                        ckpt.prune_step_checkpoints(run_dir, cfg.keep_step_checkpoints)
                if stop and not last_of_epoch:   # at the end of an epoch, stop after its validation
                    folder = run_dir / "checkpoints" / f"step-{state['step']}"
                    if not (cfg.save_every and state["step"] % cfg.save_every == 0):
                        save(folder)
                    return stop_behind(folder)
                if cfg.stop_after and steps_this_run >= cfg.stop_after:
                    return {"stopped_at_step": state["step"], "tokens_seen": state["tokens_seen"]}

            # -- end of epoch: validate, checkpoint, best
            elapsed = time.perf_counter() - epoch_start
            tokens_per_s = epoch_tokens / elapsed if elapsed > 0 else 0.0
            lr = optimizer.param_groups[0]["lr"]
            rows = [("train", finalize_metrics(runtime.reduce_sums(train_sums)))] if train_sums else []
            if data.val is not None:
                last_val = evaluate(model, data.val, runtime, bf16)
                stop = record("val", last_val, lr) or stop
                rows.append(("val", last_val))
            metrics_log.epoch_table(epoch, rows, cfg.ttt_steps, tokens_per_s)
            state["epoch"], state["batch"] = epoch + 1, 0
            val_loss = last_val.get("loss", float("nan"))
            new_best = bool(last_val) and val_loss < state["best_val"]
            if new_best:
                # best/ before the epoch checkpoint: a kill between the two saves resumes from the
                # previous epoch, which recomputes this same best, so best/ is never left stale.
                state["best_val"] = val_loss
                tensors, _ = ckpt.training_state(drafter)      # collective under FSDP2
                if runtime.is_main:
                    ckpt.save(run_dir / "best", drafter, tensors=tensors,
                              extra_json={"val.json": {"epoch": epoch + 1, "step": state["step"], **last_val}})
                runtime.barrier()
            save(run_dir / "checkpoints" / f"epoch-{epoch + 1}", last_val)
            if new_best and runtime.is_main:
                note(run_dir, "result", f"new best: epoch {epoch + 1}, step {state['step']}, "
                                        f"{state['tokens_seen']:,} tokens: {val_summary(last_val)} -> {run_dir / 'best'}")
            if stop and epoch + 1 < cfg.epochs:
                return stop_behind(run_dir / "checkpoints" / f"epoch-{epoch + 1}")
    return {"steps": state["step"], "tokens_seen": state["tokens_seen"], "val": last_val,
            "best_val_loss": state["best_val"]}


def _nan_error(what: str, value: torch.Tensor, ranks_bad: int, world_size: int, state: dict, epoch: int,
               batch: int, run_dir: Path) -> SpecdraftError:
    last = ckpt.latest_checkpoint(run_dir)
    kept = f"last good checkpoint {last} is intact" if last else "no checkpoint was written yet"
    local = float(value.detach())
    shown = str(local) if not math.isfinite(local) else "not finite"
    where = f" on {ranks_bad} of {world_size} ranks" if world_size > 1 else ""
    return SpecdraftError(f"training stopped: {what} is {shown}{where} at step {state['step'] + 1} (epoch "
                          f"{epoch + 1}, batch {batch}); {kept}; check the store for inf/NaN or lower --lr")


# ----------------------------------------------------------------------------- watch and journal

def any_rank(runtime: Runtime, flag: bool) -> bool:
    """True on every rank when `flag` is True on any (one all_reduce; a no-op on one process)."""
    if runtime.world_size == 1:
        return bool(flag)
    return float(runtime.reduce_sums({"flag": torch.tensor(float(flag), dtype=torch.float64)})["flag"]) > 0


def note(run_dir: Path, kind: str, text: str) -> None:
    """An automatic RUN/journal.md entry from training (rank 0 only; callers check)."""
    from specdraft.analysis import journal

    journal.record(run_dir, kind, text, source="train")


def val_summary(metrics: dict) -> str:
    keys = ("loss", "full_acc_0", "accept_len")
    return ", ".join(f"val {k} {metrics[k]:.4f}" for k in keys if k in metrics)


def start_summary(cfg: RunConfig, resume_from: Path | None, remap_report: dict | None, total_steps: int,
                  state: dict) -> str:
    """The run-start journal entry: where it starts from and the settings that decide the outcome."""
    if resume_from is not None:
        head = f"resumed from {resume_from} at step {state['step']} ({state['tokens_seen']:,} tokens)"
    elif cfg.from_pretrained:
        head = f"started from pretrained {cfg.from_pretrained}"
        if remap_report and remap_report.get("remapped"):
            head += (f" (lm_head remapped: overlap {remap_report['overlap']}, positional matches "
                     f"{remap_report['positional_matches']})")
    else:
        head = "started from scratch"
    text = (f"{head}: store {cfg.store}, vocab {cfg.vocab}, model {cfg.model}; {cfg.epochs} epochs = "
            f"{total_steps} steps, lr {cfg.lr:g} ({cfg.schedule}, warm-up {cfg.warmup_steps}), TTT {cfg.ttt_steps}, "
            f"loss {cfg.loss}, aux_noise {cfg.aux_noise:g}, seed {cfg.seed}")
    if cfg.baseline:
        text += (f"; watching baseline {cfg.baseline} ({cfg.watch_split} {cfg.watch_metric}, margin "
                 f"{cfg.watch_margin:g}{', stop if behind' if cfg.stop_if_behind else ''})")
    return text


def load_watch(cfg: RunConfig, run_dir: Path):
    """The baseline watch, checked before anything is written. Every rank loads it, so a bad
    --baseline fails everywhere at once; only rank 0 feeds it."""
    from specdraft.analysis.watch import BaselineWatch

    if Path(cfg.baseline).resolve() == run_dir.resolve():
        raise SpecdraftError(f"--baseline {cfg.baseline}: is this run itself; pass another run folder")
    return BaselineWatch.from_run(cfg.baseline, cfg.watch_config())


def replay_run(watch, run_dir: Path, log) -> None:
    """On resume, feed the run's metrics.jsonl (already cut at the checkpoint's step) through the
    watch, so smoothing and the behind-streak continue where they were; a verdict found there is
    reported on the console, not journaled again (the first run journaled it)."""
    if not (run_dir / "metrics.jsonl").exists():
        return
    for rec in load_run(run_dir).records:
        watch.update(rec)
    if watch.verdict is not None:
        log(f"[yellow]watch (before resume):[/] {watch.verdict.message}")


class _progress:
    """A rich progress bar over optimizer steps with tokens/s, or nothing."""

    def __init__(self, enabled: bool, total: int, done: int):
        self.enabled, self.total, self.done = enabled, total, done

    def __enter__(self):
        if not self.enabled:
            return lambda tokens: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[tps]} tok/s"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
        self.progress.start()
        task = self.progress.add_task("train", total=self.total, completed=self.done, tps="-")
        start, seen = time.perf_counter(), [0]

        def advance(tokens: int) -> None:
            seen[0] += tokens
            rate = seen[0] / max(time.perf_counter() - start, 1e-9)
            self.progress.update(task, advance=1, tps=f"{rate:,.0f}")
        return advance

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.stop()
        return False
