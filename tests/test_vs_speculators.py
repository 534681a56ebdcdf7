"""benchmarks/vs_speculators.py without speculators installed: our store -> speculators' offline
data files and back, the train/validation cut, and the flags that keep both trainers on the same
inputs and drafter layout."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from specdraft import vocab as vocab_mod
from specdraft.data import store as st
from specdraft.train.batches import split_samples
from specdraft.train.config import RunConfig

H = 8
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vs():
    spec = importlib.util.spec_from_file_location("vs_speculators", ROOT / "benchmarks" / "vs_speculators.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_store(root: Path, n: int = 9) -> st.HiddenStore:
    g = torch.Generator().manual_seed(0)
    lengths = [4 + (i * 5) % 9 for i in range(n)]
    writer = st.StoreWriter(root, st.new_manifest({"id": "tiny", "fingerprint": "f" * 32}, [1, 2, 3], "bfloat16", H))
    T = sum(lengths)
    writer.write_shard(torch.randn(T, 3, H, generator=g), torch.randn(T, H, generator=g),
                       torch.randint(0, 50, (T,), generator=g), (torch.rand(T, generator=g) > 0.5).to(torch.uint8),
                       torch.tensor([0] + lengths).cumsum(0))
    writer.save(complete=True)
    return st.HiddenStore(root)


def test_store_to_speculators_round_trip(vs, tmp_path):
    store = write_store(tmp_path / "hidden")
    d2t, t2d = vocab_mod.mapping_from_counts(np.arange(64, dtype=np.int64), 16)
    vocab = vocab_mod.Vocab(d2t, t2d, {})
    order = [4, 0, 7, 2]
    out = vs.store_to_speculators(store, order, tmp_path / "spec", vocab, all_ones_mask={7})
    for j, i in enumerate(order):
        got, want = vs.read_speculators_sample(out, j), store[i]
        assert torch.equal(got["input_ids"], want["input_ids"])
        assert torch.equal(got["aux"], want["aux"]) and torch.equal(got["last"], want["last"])
        assert got["aux"].dtype == torch.bfloat16 and got["seq_len"] == len(want["input_ids"])
        mask = torch.ones_like(want["loss_mask"]) if i == 7 else want["loss_mask"]
        assert torch.equal(got["loss_mask"].to(torch.uint8), mask)
    assert sorted(p.name for p in (out / "hidden_states").iterdir()) == [f"hs_{j}.safetensors" for j in range(4)]
    assert np.array_equal(np.load(out / "d2t.npy"), d2t.numpy())
    assert np.array_equal(np.load(out / "t2d.npy"), t2d.numpy())


def test_sub_store_keeps_samples(vs, tmp_path):
    store = write_store(tmp_path / "hidden")
    small = st.HiddenStore(vs.sub_store(store, [0, 1, 2], tmp_path / "small"))
    assert len(small) == 3 and small.layer_ids == store.layer_ids
    for i in range(3):
        assert all(torch.equal(small[i][k], store[i][k]) for k in ("input_ids", "loss_mask", "aux", "last"))


@pytest.mark.parametrize("n", [2, 3, 20, 57, 243, 256, 1001])
def test_train_data_ratio_cuts_at_our_split(vs, tmp_path, n):
    """speculators keeps rows [0, int(n * ratio)) for training: exactly our train samples."""
    train, val = split_samples(n, 0.05, 0)
    cfg = RunConfig(ttt_steps=2, max_tokens=512, epochs=3)
    ratio = (len(train) + 0.5) / n
    argv = vs.speculators_argv(cfg, tmp_path, tmp_path / "run", "model", 16, ratio, False, ["--lr", "3e-3"])
    got = float(argv[argv.index("--train-data-ratio") + 1])
    assert 0 < got < 1 and math.floor(n * got) == len(train)


def test_speculators_flags_follow_our_config(vs, tmp_path):
    cfg = RunConfig(ttt_steps=3, max_tokens=256, epochs=4, norm_before_residual=False, loss="kl")
    argv = vs.speculators_argv(cfg, tmp_path, tmp_path / "run", "model", 16, 0.9, True, [])
    value = lambda flag: argv[argv.index(flag) + 1]
    assert (value("--ttt-steps"), value("--total-seq-len"), value("--epochs")) == ("3", "256", "4")
    assert value("--hidden-states-dtype") == "bfloat16" and value("--loss-fn") == "kl_div"
    assert value("--draft-attn-impl") == "sdpa" and value("--loss-implementation") == "eager"
    assert {"--no-norm-before-residual", "--no-norm-before-fc", "--no-norm-output"} <= set(argv)
    assert "--fc-norm" not in argv
