"""Training from the hidden store: packing, loop, checkpoints, exact resume, remap, NaN guard, CLI."""

import json
import subprocess
import sys

import pytest
import torch

from specdraft import vocab as vocab_mod
from specdraft.data.capture import capture_samples, recording
from specdraft.data.store import HiddenStore, StoreWriter, new_manifest
from specdraft.errors import SpecdraftError
from specdraft.targets import load_target
from specdraft.train import checkpoint as ckpt
from specdraft.train.batches import StoreBatches, pack_rows, split_samples
from specdraft.train.config import RunConfig
from specdraft.train.drafters import pretrained_drafter
from specdraft.train.loop import train

LAYERS = [2, 4, 5]
DRAFT = 48


def write_store(out, target, samples, masks, nan_sample=None):
    manifest = new_manifest(target.identity, LAYERS, "float32", target.hidden_size)
    writer = StoreWriter(out, manifest)
    with recording(target.model, LAYERS) as rec:
        aux, last, offsets = capture_samples(target.model, samples, LAYERS, torch.float32, 4096, rec)
    if nan_sample is not None:
        aux[offsets[nan_sample]:offsets[nan_sample + 1]] = float("nan")
    ids = torch.tensor([t for s in samples for t in s])
    mask = torch.tensor([m for s in masks for m in s], dtype=torch.uint8)
    writer.write_shard(aux, last, ids, mask, offsets)
    writer.save(complete=True)
    return out


def write_workspace(root, target, samples, masks) -> None:
    """root/hidden (the store of `samples`) and root/vocab.safetensors (a DRAFT-token vocab from them)."""
    write_store(root / "hidden", target, samples, masks)
    counts = vocab_mod.count_tokens(torch.tensor(sum(samples, [])).numpy(), torch.tensor(sum(masks, [])).numpy(),
                                    target.vocab_size)
    d2t, t2d = vocab_mod.mapping_from_counts(counts, DRAFT)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {"target_id": target.name, "fingerprint": target.identity["fingerprint"]}),
                   root / "vocab.safetensors")


@pytest.fixture(scope="session")
def ws(tiny_target, tmp_path_factory):
    """A tiny workspace: 12 samples captured from the tiny target, a 48-token draft vocab."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ws")
    target = load_target(str(tiny_target))
    g = torch.Generator().manual_seed(0)
    samples, masks = [], []
    for i in range(12):
        n = 14 + (i * 5) % 17
        samples.append(torch.randint(7, 7 + 60, (n,), generator=g).tolist())
        masks.append([0] * 4 + [1] * (n - 4))
    write_workspace(root, target, samples, masks)
    return {"root": root, "target": target, "model": str(tiny_target), "samples": samples, "masks": masks}


def config(ws, out, **kw):
    base = dict(out=str(out), store=str(ws["root"] / "hidden"), vocab=str(ws["root"] / "vocab.safetensors"),
                model=ws["model"], max_tokens=64, rows_per_batch=1, epochs=2, lr=2e-3, warmup_steps=2,
                log_every=1, val_fraction=0.2, progress=False, precision="fp32")
    base.update(kw)
    return RunConfig(**base)


def read_metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- batches

def test_split_is_by_sample_and_seeded():
    train_ids, val_ids = split_samples(20, 0.2, seed=3)
    assert len(val_ids) == 4 and not set(train_ids) & set(val_ids) and sorted(train_ids + val_ids) == list(range(20))
    assert split_samples(20, 0.2, seed=3) == (train_ids, val_ids)
    assert split_samples(20, 0.2, seed=4) != (train_ids, val_ids)


def test_pack_rows_fits_and_keeps_every_sample():
    lengths = [30, 10, 50, 20, 64, 5, 100]
    rows = pack_rows(list(range(7)), lengths, 64)
    assert sorted(s for r in rows for s in r) == list(range(7))
    assert all(sum(min(lengths[s], 64) for s in r) <= 64 for r in rows)


def test_packed_batches_docs_positions_and_ranks(ws):
    store = HiddenStore(ws["root"] / "hidden")
    ids = list(range(len(store)))
    full = StoreBatches(store, ids, max_tokens=64, rows_per_batch=2, seed=1)
    batch = next(full.batches(0))
    lengths = store.sample_lengths
    row = full.rank_rows(0, 0)[0]
    at = 0
    for doc, s in enumerate(row):
        n = lengths[s]
        assert batch["doc_ids"][0, at:at + n].eq(doc).all()
        assert batch["position_ids"][0, at:at + n].tolist() == list(range(n))
        assert batch["input_ids"][0, at:at + n].tolist() == ws["samples"][s]
        torch.testing.assert_close(batch["aux"][0, at:at + n], store[s]["aux"])
        at += n
    assert batch["doc_ids"][0, at:].eq(-1).all() and batch["loss_mask"][0, at:].eq(0).all()
    # two ranks take disjoint rows and together every row of the one-rank view with rows_per_batch=2
    ranks = [StoreBatches(store, ids, max_tokens=64, rows_per_batch=1, seed=1, rank=r, world_size=2) for r in (0, 1)]
    assert ranks[0].num_batches(0) == full.num_batches(0)
    for b in range(full.num_batches(0)):
        assert ranks[0].rank_rows(0, b) + ranks[1].rank_rows(0, b) == full.rank_rows(0, b)
    # deterministic per epoch, different across epochs
    assert full.rows(1) == StoreBatches(store, ids, max_tokens=64, rows_per_batch=2, seed=1).rows(1)
    assert full.rows(0) != full.rows(1)


def test_batches_read_by_workers_are_the_same_batches_in_the_same_order(ws):
    """The DataLoader's workers read the store (each opening its own shards, one already open in
    this process) and give exactly the batches of the in-process read, also from a resume position;
    reading them leaves the global RNG (the aux-noise draws) where it was."""
    store = HiddenStore(ws["root"] / "hidden")
    store[0]
    ids = list(range(len(store)))
    here = StoreBatches(store, ids, max_tokens=64, rows_per_batch=2, seed=1)
    workers = StoreBatches(store, ids, max_tokens=64, rows_per_batch=2, seed=1, workers=2)
    rng = torch.get_rng_state()
    for start in (0, 2):
        got, want = list(workers.batches(1, start)), list(here.batches(1, start))
        assert len(got) == len(want) == here.num_batches(1) - start
        for a, b in zip(got, want):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(torch.get_rng_state(), rng)


# ----------------------------------------------------------------------------- loop

def test_train_writes_metrics_checkpoints_and_best(ws, tmp_path):
    run = tmp_path / "run"
    summary = train(config(ws, run, epochs=2))
    records = read_metrics(run)
    assert {r["split"] for r in records} == {"train", "val"}
    assert [r["epoch"] for r in records if r["split"] == "val"] == [0, 1]
    for r in records:
        assert {"split", "epoch", "step", "tokens_seen", "lr", "metrics"} <= r.keys()
        assert {"loss_0", "full_acc_2", "cond_acc_1", "accept_len"} <= r["metrics"].keys()
    for name in ("epoch-1", "epoch-2"):
        folder = run / "checkpoints" / name
        assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
        state = ckpt.load_trainer_state(folder)
        assert {"optimizer", "scheduler", "rng", "epoch", "batch", "step", "tokens_seen"} <= state.keys()
    assert (run / "best" / "model.safetensors").is_file() and (run / "config.yaml").is_file()
    first, last = records[0]["metrics"]["loss"], summary["val"]["loss"]
    assert last < first
    from specdraft.formats.checkpoints import load_drafter
    drafter = load_drafter(run / "checkpoints" / "epoch-2")
    assert drafter.lm_head.weight.shape[0] == DRAFT and not drafter.embed_tokens.weight.requires_grad


def test_training_loads_only_the_target_head_and_trains_as_with_the_whole_target(ws, tmp_path):
    """train() without a target reads embeddings, final norm and lm_head from the checkpoint
    (targets.TargetHead): the run is identical to one given the whole loaded target."""
    from specdraft.targets import TargetHead
    from specdraft.train.inputs import training_target

    cfg = config(ws, tmp_path / "head", epochs=1)
    assert isinstance(training_target(cfg).model, TargetHead)
    train(cfg)
    train(config(ws, tmp_path / "whole", epochs=1), target=ws["target"])
    assert read_metrics(tmp_path / "head") == read_metrics(tmp_path / "whole")


def test_train_on_prompts_trains_every_position_and_validates_on_the_mask(ws, tmp_path, monkeypatch):
    from specdraft.model.eagle3 import objective

    seen = []                                               # (training?, positions, loss-masked positions)
    original = objective.TTTObjective.forward

    def spy(self, batch):
        real = batch["doc_ids"] >= 0
        seen.append((self.training, int(real.sum()), int(batch["loss_mask"][real].sum())))
        return original(self, batch)

    monkeypatch.setattr(objective.TTTObjective, "forward", spy)
    train(config(ws, tmp_path / "run", epochs=1, train_on_prompts=True))
    trained = [(n, m) for training, n, m in seen if training]
    validated = [(n, m) for training, n, m in seen if not training]
    assert trained and all(m == n for n, m in trained)     # every real position is trained
    assert validated and all(m < n for n, m in validated)  # validation keeps the prompts out


def test_resume_mid_epoch_is_exact(ws, tmp_path):
    kw = dict(epochs=2, save_every=3, aux_noise=0.05, keep_step_checkpoints=5)
    full = tmp_path / "full"
    train(config(ws, full, **kw))
    cut = tmp_path / "cut"
    train(config(ws, cut, stop_after=7, **kw))             # "killed" after step 7 (4 steps per epoch)
    assert ckpt.latest_checkpoint(cut).name == "step-6"    # mid epoch 2: resume must skip 2 batches
    train(config(ws, cut, resume=True, **kw))
    a, b = read_metrics(full), read_metrics(cut)
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert (ra["split"], ra["epoch"], ra["step"], ra["tokens_seen"]) == (rb["split"], rb["epoch"], rb["step"], rb["tokens_seen"])
        assert ra["lr"] == pytest.approx(rb["lr"], abs=1e-12)
        for k, v in ra["metrics"].items():
            assert v == pytest.approx(rb["metrics"][k], abs=1e-6), (ra["step"], k)


def test_nan_loss_stops_with_step_and_keeps_checkpoint(ws, tmp_path):
    store = write_store(tmp_path / "nan_hidden", ws["target"], ws["samples"], ws["masks"], nan_sample=5)
    run = tmp_path / "run"
    with pytest.raises(SpecdraftError, match=r"loss is nan at step \d+ \(epoch \d+, batch \d+\)"):
        train(config(ws, run, store=str(store), epochs=3, val_fraction=0.0))
    latest = ckpt.latest_checkpoint(run)
    if latest is not None:                               # whatever was saved before the NaN loads
        ckpt.load_trainer_state(latest)


def test_input_mismatch_errors(ws, tmp_path):
    bad_vocab = tmp_path / "bad_vocab.safetensors"
    d2t, t2d = vocab_mod.mapping_from_counts(torch.ones(300).numpy(), DRAFT)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {}), bad_vocab)
    with pytest.raises(SpecdraftError, match="vocab size: .* 300 tokens but target .* 263"):
        train(config(ws, tmp_path / "r1", vocab=str(bad_vocab)))
    other = tmp_path / "other_vocab.safetensors"
    v = vocab_mod.load(ws["root"] / "vocab.safetensors")
    vocab_mod.save(vocab_mod.Vocab(v.d2t, v.t2d, {"fingerprint": "deadbeef"}), other)
    with pytest.raises(SpecdraftError, match=r"target fingerprint: store .* but .*\(deadbeef\)"):
        train(config(ws, tmp_path / "r2", vocab=str(other)))


# ----------------------------------------------------------------------------- from-pretrained / remap

def shifted_vocab(ws, tmp_path):
    """A run vocab sharing most tokens with the original one, with different draft ids."""
    v = vocab_mod.load(ws["root"] / "vocab.safetensors")
    tokens = v.draft_to_target.tolist()
    new_tokens = sorted(tokens[:-5] + [1, 2, 3, 4, 5])          # drop 5 tokens, add 5 lower ones: ids shift
    counts = torch.zeros(v.target_vocab_size)
    counts[new_tokens] = 1
    d2t, t2d = vocab_mod.mapping_from_counts(counts.numpy(), DRAFT)
    path = tmp_path / "vocab_b.safetensors"
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {}), path)
    return vocab_mod.load(path), path


def test_remap_moves_rows_and_predicts_the_same_target_tokens(ws, tmp_path):
    run = tmp_path / "src"
    train(config(ws, run, epochs=1))
    src_dir = run / "checkpoints" / "epoch-1"
    vocab_b, path_b = shifted_vocab(ws, tmp_path)
    cfg = config(ws, tmp_path / "dst", vocab=str(path_b), from_pretrained=str(src_dir))
    logs = []
    remapped, report = pretrained_drafter(cfg, ws["target"], vocab_b, LAYERS, logs.append)
    assert report["remapped"] and report["carried"] == DRAFT - 5 and report["from_target"] == 5
    assert any("carried 43" in line for line in logs)
    from specdraft.formats.checkpoints import load_drafter
    from specdraft.model.eagle3.module import DynamicCache, causal_mask
    src = load_drafter(src_dir)
    ids = torch.randint(7, 60, (1, 10))
    hidden = torch.randn(1, 10, ws["target"].hidden_size)
    args = (ids, hidden, torch.arange(10)[None], causal_mask(torch.zeros(1, 10, dtype=torch.long)))
    with torch.no_grad():
        la, _ = src(*args, DynamicCache())
        lb, _ = remapped.eval()(*args, DynamicCache())
    va = vocab_mod.load(ws["root"] / "vocab.safetensors")
    shared = sorted(set(va.draft_to_target.tolist()) & set(vocab_b.draft_to_target.tolist()))
    col_a = {t: i for i, t in enumerate(va.draft_to_target.tolist())}
    col_b = {t: i for i, t in enumerate(vocab_b.draft_to_target.tolist())}
    torch.testing.assert_close(la[..., [col_a[t] for t in shared]], lb[..., [col_b[t] for t in shared]])
    # the same target token wins when restricted to shared tokens
    assert torch.equal(la[..., [col_a[t] for t in shared]].argmax(-1), lb[..., [col_b[t] for t in shared]].argmax(-1))


def test_mapping_mismatch_without_remap_is_refused(ws, tmp_path):
    run = tmp_path / "src"
    train(config(ws, run, epochs=1))
    vocab_b, path_b = shifted_vocab(ws, tmp_path)
    cfg = config(ws, tmp_path / "dst", vocab=str(path_b), from_pretrained=str(run / "checkpoints" / "epoch-1"),
                 remap=False)
    with pytest.raises(SpecdraftError, match=r"token overlap 43/48, positional matches 0/48\); pass --remap"):
        train(cfg)


# ----------------------------------------------------------------------------- CLI

def test_cli_hidden_size_mismatch_is_one_line_rc2(ws, tmp_path):
    from specdraft.testing import save_tiny_target

    other = save_tiny_target(tmp_path / "small", hidden_size=32, num_layers=8)
    r = subprocess.run([sys.executable, "-m", "specdraft.cli", "train", "--store", str(ws["root"] / "hidden"),
                        "--vocab", str(ws["root"] / "vocab.safetensors"), "--model", str(other),
                        "--out", str(tmp_path / "run"), "--no-progress"],
                       capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": "", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("error")]   # (+ transformers' load bar)
    assert "Traceback" not in r.stderr and len(lines) == 1 and "hidden size" in lines[0] and "H=64" in lines[0] and "H=32" in lines[0], r.stderr


def test_cli_yaml_with_flag_override(ws, tmp_path):
    run = tmp_path / "run"
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text(f"store: {ws['root'] / 'hidden'}\nvocab: {ws['root'] / 'vocab.safetensors'}\n"
                         f"model: {ws['model']}\nout: {run}\nmax_tokens: 64\nepochs: 5\nprecision: fp32\n")
    r = subprocess.run([sys.executable, "-m", "specdraft.cli", "train", "--config", str(yaml_file), "--epochs", "1",
                        "--ttt-steps", "2", "--no-progress"],
                       capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": "", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    import yaml
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["epochs"] == 1 and saved["ttt_steps"] == 2 and saved["max_tokens"] == 64
    assert (run / "checkpoints" / "epoch-1").is_dir() and not (run / "checkpoints" / "epoch-2").exists()


# ----------------------------------------------------------------------------- baseline watch, journal, collective stops

WATCH = dict(max_tokens=128, epochs=5, lr=4e-3, warmup_steps=4, val_every=6, val_fraction=0.25,
             watch_margin=0.15, watch_min_points=3, watch_warmup_tokens=1000)


@pytest.fixture(scope="module")
def watch_ws(tiny_target, tmp_path_factory):
    """64 samples (~30 tokens) from the tiny target and a healthy 5-epoch baseline run (val every 6 steps)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("watch_ws")
    target = load_target(str(tiny_target))
    g = torch.Generator().manual_seed(0)
    samples = [torch.randint(7, 7 + 60, (24 + (i * 7) % 17,), generator=g).tolist() for i in range(64)]
    masks = [[0] * 4 + [1] * (len(s) - 4) for s in samples]
    write_workspace(root, target, samples, masks)
    ws = {"root": root, "target": target, "model": str(tiny_target)}
    train(config(ws, root / "baseline", **WATCH))
    ws["baseline"] = root / "baseline"
    return ws


def journal_entries(run):
    from specdraft import journal
    return journal.read(run)


def test_watch_stays_quiet_on_a_healthy_run_with_another_seed(watch_ws, tmp_path):
    run = tmp_path / "seed1"
    summary = train(config(watch_ws, run, seed=1, baseline=str(watch_ws["baseline"]), stop_if_behind=True, **WATCH))
    assert "stopped" not in summary and (run / "checkpoints" / "epoch-5").is_dir()
    kinds = [(e.kind, e.source) for e in journal_entries(run)]
    assert ("warning", "watch") not in kinds
    assert kinds[0] == ("decision", "train") and ("result", "train") in kinds   # run start, new best
    start = journal_entries(run)[0].text
    assert start.startswith("started from scratch") and "watching baseline" in start and "stop if behind" in start
    # the baseline itself journaled its start and its bests
    assert [e.kind for e in journal_entries(watch_ws["baseline"])][:2] == ["decision", "result"]


def test_watch_flags_a_crippled_run_and_journals_the_evidence(watch_ws, tmp_path):
    run = tmp_path / "crippled"
    summary = train(config(watch_ws, run, **dict(WATCH, lr=1e-5, baseline=str(watch_ws["baseline"]), stop_after=30)))
    assert "stopped" not in summary and summary["stopped_at_step"] == 30   # warned, not stopped
    warnings = [e for e in journal_entries(run) if e.kind == "warning"]
    assert len(warnings) == 1 and warnings[0].source == "watch"
    assert "behind baseline: val full_acc_0" in warnings[0].text and "3 consecutive points" in warnings[0].text


def test_stop_if_behind_stops_with_checkpoint_and_resume_replays(watch_ws, tmp_path):
    run = tmp_path / "stopped"
    kw = dict(WATCH, lr=1e-5, baseline=str(watch_ws["baseline"]), stop_if_behind=True)
    summary = train(config(watch_ws, run, **kw))
    assert summary["stopped"] == "behind baseline" and not (run / "checkpoints" / "epoch-2").exists()
    folder = ckpt.latest_checkpoint(run)
    assert str(folder) == summary["checkpoint"] and folder.name == f"step-{summary['steps']}"
    state = ckpt.load_trainer_state(folder)
    assert state["step"] == summary["steps"]
    from specdraft.formats.checkpoints import load_drafter
    load_drafter(folder)                                                 # inspectable
    entries = journal_entries(run)
    assert [(e.kind, e.source) for e in entries[-2:]] == [("warning", "watch"), ("decision", "train")]
    assert f"stopped at step {summary['steps']}" in entries[-1].text and str(folder) in entries[-1].text
    # resume: the metrics are replayed through the watch first, so it does not fire (or journal) again
    resumed = train(config(watch_ws, run, resume=True, stop_after=6, **kw))
    assert "stopped" not in resumed and resumed["stopped_at_step"] == summary["steps"] + 6
    entries = journal_entries(run)
    assert sum(e.kind == "warning" for e in entries) == 1
    assert entries[-1].kind == "decision" and entries[-1].text.startswith(f"resumed from {folder}")


def test_baseline_and_watch_options_are_checked(watch_ws, tmp_path):
    with pytest.raises(SpecdraftError, match="--stop-if-behind: needs --baseline"):
        train(config(watch_ws, tmp_path / "r", stop_if_behind=True))
    with pytest.raises(SpecdraftError, match="--watch-split"):
        train(config(watch_ws, tmp_path / "r", baseline=str(watch_ws["baseline"]), watch_split="test"))
    with pytest.raises(SpecdraftError, match="no metrics.jsonl"):
        train(config(watch_ws, tmp_path / "r", baseline=str(tmp_path / "nothing")))
    assert not (tmp_path / "r").exists()                                  # refused before writing anything


def torchrun_train(settings: dict, timeout=120):
    from specdraft.train import distributed

    flags = []
    for k, v in settings.items():
        flag = "--" + k.replace("_", "-")
        flags += [flag if v is True else f"--no-{flag[2:]}"] if isinstance(v, bool) else [flag, str(v)]
    import os
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(distributed.torchrun_command(2, flags), capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_two_ranks_stop_together_when_behind(watch_ws, tmp_path):
    """The watch runs on rank 0 only; its stop reaches rank 1 (else rank 1 would wait at its next
    collective). The NaN stop uses the same all_reduce'd flag (checked by hand: both ranks print
    'loss is nan / not finite on 1 of 2 ranks at step 1'; a torchrun launch costs ~15 s here)."""
    run = tmp_path / "behind"
    kw = config(watch_ws, run, **dict(WATCH, lr=1e-5, baseline=str(watch_ws["baseline"]),
                                      stop_if_behind=True)).to_dict()
    proc = torchrun_train({k: v for k, v in kw.items() if v is not None})
    assert proc.returncode == 0, proc.stderr[-3000:]
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None and latest.name.startswith("step-") and not (run / "checkpoints" / "epoch-2").exists()
    entries = journal_entries(run)
    assert [(e.kind, e.source) for e in entries[-2:]] == [("warning", "watch"), ("decision", "train")]
    assert proc.stderr.count("stopped at step") == 1                      # said once, by rank 0


def test_metrics_log_truncate_skips_a_line_cut_by_a_kill(tmp_path):
    from specdraft.metrics import MetricsLog

    log = MetricsLog(tmp_path, enabled=True, console=None)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 5, "loss": 1.0}\n{"step": 9, "lo')
    log.truncate_after(5)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 5]
