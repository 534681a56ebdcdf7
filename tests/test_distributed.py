"""Distributed training: 2-rank gloo DDP under torchrun follows the 1-process loss curve exactly."""

import json
import os
import subprocess
import sys

import pytest
import torch

from specdraft import vocab as vocab_mod
from specdraft.data.capture import capture_samples, recording
from specdraft.data.store import StoreWriter, new_manifest
from specdraft.errors import SpecdraftError
from specdraft.targets import load_target
from specdraft.train import distributed
from specdraft.train.config import RunConfig
from specdraft.train.loop import train

LAYERS = [2, 4, 5]
DRAFT = 48
T = 32          # every sample is exactly one packed row


@pytest.fixture(scope="module")
def ws(tiny_target, tmp_path_factory):
    """8 samples of T tokens (loss mask off on the first 4): every row, hence every rank, holds the
    same number of trained positions per TTT step, so DDP's mean of rank means is the global mean."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ws_dist")
    target = load_target(str(tiny_target))
    g = torch.Generator().manual_seed(1)
    samples = [torch.randint(7, 7 + 60, (T,), generator=g).tolist() for _ in range(8)]
    masks = [[0] * 4 + [1] * (T - 4) for _ in samples]
    writer = StoreWriter(root / "hidden", new_manifest(target.identity, LAYERS, "float32", target.hidden_size))
    with recording(target.model, LAYERS) as rec:
        aux, last, offsets = capture_samples(target.model, samples, LAYERS, torch.float32, 4096, rec)
    writer.write_shard(aux, last, torch.tensor(sum(samples, [])), torch.tensor(sum(masks, []), dtype=torch.uint8),
                       offsets)
    writer.save(complete=True)
    counts = vocab_mod.count_tokens(torch.tensor(sum(samples, [])).numpy(), torch.tensor(sum(masks, [])).numpy(),
                                    target.vocab_size)
    d2t, t2d = vocab_mod.mapping_from_counts(counts, DRAFT)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {"target_id": target.name, "fingerprint": target.identity["fingerprint"]}),
                   root / "vocab.safetensors")
    return {"root": root, "model": str(tiny_target)}


def settings(ws, out, rows_per_batch):
    return dict(out=str(out), store=str(ws["root"] / "hidden"), vocab=str(ws["root"] / "vocab.safetensors"),
                model=ws["model"], max_tokens=T, rows_per_batch=rows_per_batch, epochs=1, lr=3e-3,
                warmup_steps=0, schedule="constant", log_every=1, val_fraction=0.0, progress=False,
                precision="fp32")


def train_losses(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["metrics"]["loss"], r["metrics"]["full_acc_0"], r["tokens_seen"])
            for r in lines if r["split"] == "train"]


def test_two_rank_ddp_matches_one_process(ws, tmp_path):
    # one process, global batch of 2 rows
    train(RunConfig(**settings(ws, tmp_path / "one", rows_per_batch=2)))
    # two gloo ranks under torchrun, 1 row each: the same global batches
    flags = []
    for k, v in settings(ws, tmp_path / "two", rows_per_batch=1).items():
        flag = "--" + k.replace("_", "-")
        flags += [flag if v is True else f"--no-{flag[2:]}"] if isinstance(v, bool) else [flag, str(v)]
    cmd = distributed.torchrun_command(2, flags)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(one) == len(two) == 4                          # rank 1 wrote no lines of its own
    assert one[-1][1] < one[0][1]                             # it trains
    for (s1, loss1, acc1, tok1), (s2, loss2, acc2, tok2) in zip(one, two):
        assert s1 == s2 and tok1 == tok2                      # tokens_seen counts both ranks
        assert loss2 == pytest.approx(loss1, rel=1e-4)
        assert acc2 == pytest.approx(acc1, abs=1e-9)
    # the final weights agree too (rank 0's checkpoint)
    from safetensors.torch import load_file
    w1 = load_file(tmp_path / "one" / "checkpoints" / "epoch-1" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "checkpoints" / "epoch-1" / "model.safetensors")
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=1e-5, msg=name)


def test_all_reduce_sums_is_identity_on_one_process():
    sums = {"count_0": torch.tensor(3.0, dtype=torch.float64)}
    assert distributed.all_reduce_sums(sums) is sums
    assert distributed.rank() == 0 and distributed.world_size() == 1 and distributed.is_main()


def test_torchrun_command_and_refusals(monkeypatch):
    cmd = distributed.torchrun_command(4, ["--store", "ws/hidden"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in cmd and cmd[-4:] == ["-m", "specdraft.train", "--store", "ws/hidden"]
    assert distributed.forward_cli_args(["--nproc", "2", "-m", "default", "--nproc=3", "--lr", "1e-3"]) == \
        ["--model", "default", "--lr", "1e-3"]
    with pytest.raises(SpecdraftError, match="--nproc 0"):
        distributed.torchrun_command(0, [])
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SpecdraftError, match="torchrun"):
        distributed.init()
    with pytest.raises(SpecdraftError, match="--parallel"):
        distributed.wrap(torch.nn.Linear(2, 2), "zero3", torch.device("cpu"))


FSDP_WORKER = '''
import json, sys
import torch
from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.module import Eagle3Drafter
from specdraft.train import checkpoint, distributed
from specdraft.model.eagle3.objective import TTTObjective
from specdraft.train.objective import TeacherHead


def build():
    torch.manual_seed(0)
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, vocab_size=50, draft_vocab_size=20, aux_layer_ids=[1, 2, 3])
    return TTTObjective(Eagle3Drafter(cfg), TeacherHead(torch.ones(32), torch.randn(20, 32), 1e-6), steps=3)


def batch(rows):
    g = torch.Generator().manual_seed(1)
    B, T = 4, 16
    full = {"input_ids": torch.randint(0, 50, (B, T), generator=g), "aux": torch.randn(B, T, 3, 32, generator=g),
            "last": torch.randn(B, T, 32, generator=g), "loss_mask": torch.ones(B, T, dtype=torch.uint8),
            "doc_ids": torch.zeros(B, T, dtype=torch.long), "position_ids": torch.arange(T).expand(B, T).clone()}
    return {k: v[rows] for k, v in full.items()}


def losses(model, rows, reduce):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    out = []
    for _ in range(4):
        loss, sums = model(batch(rows))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sums = reduce(sums)
        out.append([float(sums[f"loss_sum_{k}"] / sums[f"count_{k}"]) for k in range(3)])
    return out


if __name__ == "__main__":
    rt = distributed.runtime(sys.argv[1])
    model = rt.wrap_model(build())
    res = losses(model, slice(2 * rt.rank, 2 * rt.rank + 2), rt.reduce_sums)
    full = checkpoint.full_state_dict(model.drafter)
    if rt.rank == 0:
        print("LOSSES", json.dumps([res, full["lm_head.weight"].tolist()]))
    del model, full            # as distributed.run does: nothing holds FSDP state at interpreter exit
    distributed.shutdown()
'''


def test_two_rank_fsdp2_matches_one_process(tmp_path):
    """fully_shard (gloo, CPU): 4 AdamW steps on 2 ranks x 2 rows = 1 process x 4 rows."""
    worker = tmp_path / "fsdp_worker.py"
    worker.write_text(FSDP_WORKER)
    sys.path.insert(0, str(tmp_path))
    try:
        import fsdp_worker
        model = fsdp_worker.build()
        one = fsdp_worker.losses(model, slice(0, 4), lambda s: s)
    finally:
        sys.path.remove(str(tmp_path))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(worker), "fsdp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two, lm_head = json.loads(proc.stdout.split("LOSSES", 1)[1])
    assert one[-1][0] < one[0][0]
    for a, b in zip(one, two, strict=True):
        assert b == pytest.approx(a, rel=1e-4)
    # the gathered full weights (checkpoint.full_state_dict) are the one-process weights
    torch.testing.assert_close(torch.tensor(lm_head), model.drafter.lm_head.weight.detach(), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- FSDP2 in the training loop

def as_flags(values: dict) -> list[str]:
    flags = []
    for k, v in values.items():
        flag = "--" + k.replace("_", "-")
        flags += [flag if v is True else f"--no-{flag[2:]}"] if isinstance(v, bool) else [flag, str(v)]
    return flags


def launch(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 ranks (gloo), fsdp" in proc.stderr          # --parallel fsdp reached the ranks


def fsdp_settings(ws, out, rows_per_batch):
    """2 epochs of 3 steps (6 train samples), 2 validation samples (so best/ is written)."""
    return {**settings(ws, out, rows_per_batch), "epochs": 2, "val_fraction": 0.25}


def all_records(run):
    return [(r["split"], r["step"], r["tokens_seen"], r["metrics"])
            for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]


def assert_same_records(got, want):
    assert [r[:3] for r in got] == [r[:3] for r in want]
    for (split, step, _, m2), (_, _, _, m1) in zip(got, want):
        assert m2.keys() == m1.keys()
        for name in m1:
            assert m2[name] == pytest.approx(m1[name], rel=1e-4, abs=1e-7), (split, step, name)


def assert_same_weights(folder_a, folder_b):
    from safetensors.torch import load_file

    wa, wb = load_file(folder_a / "model.safetensors"), load_file(folder_b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        assert wa[name].dtype == wb[name].dtype
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.fixture(scope="module")
def fsdp_runs(ws, tmp_path_factory):
    """One process with 2 rows per step, and `specdraft train --nproc 2 --parallel fsdp` with 1 row
    per rank: the same global batches."""
    root = tmp_path_factory.mktemp("fsdp_runs")
    train(RunConfig(**fsdp_settings(ws, root / "one", rows_per_batch=2)))
    launch([sys.executable, "-m", "specdraft.cli", "train", "--nproc", "2", "--parallel", "fsdp",
            *as_flags(fsdp_settings(ws, root / "fsdp", rows_per_batch=1))])
    return root / "one", root / "fsdp"


def test_two_rank_fsdp_training_matches_one_process(fsdp_runs):
    from specdraft.formats.checkpoints import load_drafter
    from specdraft.train import checkpoint as ckpt

    one, two = fsdp_runs
    records = all_records(two)
    assert [r[0] for r in records].count("val") == 2                # rank 1 wrote no lines of its own
    assert_same_records(records, all_records(one))
    for folder in ("checkpoints/epoch-1", "checkpoints/epoch-2", "best"):
        drafter = load_drafter(two / folder)                          # the speculators layout, loadable
        assert isinstance(drafter.lm_head.weight, torch.nn.Parameter)
        assert_same_weights(one / folder, two / folder)
        assert (json.loads((two / folder / "config.json").read_text())
                == json.loads((one / folder / "config.json").read_text()))
    # trainer state in the one-process form: optimizer state keyed by parameter index
    s1 = ckpt.load_trainer_state(one / "checkpoints" / "epoch-2")
    s2 = ckpt.load_trainer_state(two / "checkpoints" / "epoch-2")
    assert s2.keys() == s1.keys() and s2["step"] == s1["step"] == 6
    assert s2["optimizer"]["param_groups"] == s1["optimizer"]["param_groups"]
    assert s2["optimizer"]["state"].keys() == s1["optimizer"]["state"].keys()
    for i, state in s1["optimizer"]["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(s2["optimizer"]["state"][i][name], value, rtol=1e-3, atol=1e-6,
                                       msg=f"{i} {name}")


def test_two_rank_fsdp_stopped_and_resumed_matches_uninterrupted(ws, fsdp_runs, tmp_path):
    _, uninterrupted = fsdp_runs
    run = tmp_path / "resumed"
    flags = as_flags({**fsdp_settings(ws, run, rows_per_batch=1), "save_every": 2})
    # stop after 2 of 3 steps of epoch 1 (a mid-epoch step-2 checkpoint), then resume from it
    launch(distributed.torchrun_command(2, [*flags, "--parallel", "fsdp", "--stop-after", "2"]))
    assert (run / "checkpoints" / "step-2").is_dir() and not (run / "checkpoints" / "epoch-1").exists()
    launch(distributed.torchrun_command(2, [*flags, "--parallel", "fsdp", "--stop-after", "0", "--resume"]))
    assert_same_records(all_records(run), all_records(uninterrupted))
    assert_same_weights(uninterrupted / "checkpoints" / "epoch-2", run / "checkpoints" / "epoch-2")
