"""Online training: batches computed by the target in the loop equal the store's batches."""

import json

import pytest
import torch

from specdraft import vocab as vocab_mod
from specdraft.data.capture import capture
from specdraft.data.prepared import save_prepared
from specdraft.data.store import HiddenStore
from specdraft.errors import SpecdraftError
from specdraft.targets import load_target
from specdraft.train.batches import StoreBatches
from specdraft.train.config import RunConfig
from specdraft.train.loop import train
from specdraft.train.runtime import Runtime
from specdraft.train.online import OnlineBatches, online_data, online_samples

LAYERS = [2, 4, 5]
DRAFT = 48


@pytest.fixture(scope="module")
def ws(tiny_target, tmp_path_factory):
    """Prepared data (14 samples of 9..50 tokens, some longer than a row) and its fp32 store."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ws_online")
    target = load_target(str(tiny_target))
    g = torch.Generator().manual_seed(3)
    ids, masks = [], []
    for i in range(14):
        n = 9 + (i * 7) % 42
        ids.append(torch.randint(7, 7 + 60, (n,), generator=g).tolist())
        masks.append([0] * 3 + [1] * (n - 3))
    save_prepared(root / "data", {"input_ids": ids, "loss_mask": masks, "messages": ["[]"] * len(ids)},
                  {"target": target.identity})
    capture(str(tiny_target), root / "data", root / "hidden", layers=LAYERS, dtype="float32",
            batch_tokens=256, target=target, progress=False)
    counts = vocab_mod.count_tokens(torch.tensor(sum(ids, [])).numpy(), torch.tensor(sum(masks, [])).numpy(),
                                    target.vocab_size)
    d2t, t2d = vocab_mod.mapping_from_counts(counts, DRAFT)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {"target_id": target.name, "fingerprint": target.identity["fingerprint"]}),
                   root / "vocab.safetensors")
    return {"root": root, "target": target, "model": str(tiny_target)}


def test_online_batches_equal_store_batches(ws):
    store = HiddenStore(ws["root"] / "hidden")
    samples = online_samples(ws["target"], ws["root"] / "data", LAYERS, max_tokens=40)
    assert samples.sample_lengths == [min(n, 40) for n in store.sample_lengths]
    assert samples.target == store.target and samples.layer_ids == store.layer_ids
    ids = list(range(len(store)))
    packed = False
    for rank in range(2):     # also the rank sharding of a 2-process run
        common = dict(max_tokens=40, rows_per_batch=2, seed=5, shuffle=True, rank=rank, world_size=2)
        from_store, online = StoreBatches(store, ids, **common), OnlineBatches(samples, ids, **common)
        assert online.num_batches(1) == from_store.num_batches(1) > 1
        for a, b in zip(from_store.batches(1), online.batches(1), strict=True):
            assert a.keys() == b.keys()
            for key in ("input_ids", "loss_mask", "doc_ids", "position_ids"):
                assert torch.equal(a[key], b[key]), key
            for key in ("aux", "last"):   # other batch compositions: float rounding only
                torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-5, msg=key)
            packed |= bool((a["doc_ids"] >= 1).any())
    assert packed                                      # rows really pack several samples
    assert not samples._ready                          # nothing kept between batches


def test_online_training_gives_the_store_metrics(ws, tmp_path):
    base = dict(store=str(ws["root"] / "hidden"), vocab=str(ws["root"] / "vocab.safetensors"), model=ws["model"],
                max_tokens=40, rows_per_batch=2, epochs=1, lr=3e-3, warmup_steps=0, log_every=1,
                val_fraction=0.2, progress=False, precision="fp32")
    train(RunConfig(out=str(tmp_path / "store"), **base), target=ws["target"])
    cfg = RunConfig(out=str(tmp_path / "online"), **base)
    data = online_data(cfg, Runtime(), ws["target"], ws["root"] / "data", LAYERS)
    train(cfg, data=data, target=ws["target"])

    def metrics(run):
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    a, b = metrics(tmp_path / "store"), metrics(tmp_path / "online")
    assert [r["split"] for r in a] == [r["split"] for r in b] and "val" in {r["split"] for r in a}
    for ra, rb in zip(a, b):
        assert ra["tokens_seen"] == rb["tokens_seen"]
        for k, v in ra["metrics"].items():
            assert rb["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert not any((tmp_path / "online").rglob("*shard*"))   # nothing but the run folder written


def test_online_refuses_data_of_another_target(ws, tmp_path):
    other = dict(ws["target"].identity, fingerprint="0" * 32, id="other")
    save_prepared(tmp_path / "data", {"input_ids": [[7, 8, 9]], "loss_mask": [[1, 1, 1]], "messages": ["[]"]},
                  {"target": other})
    with pytest.raises(SpecdraftError, match="prepared for other"):
        online_samples(ws["target"], tmp_path / "data")
    save_prepared(tmp_path / "big", {"input_ids": [[7, 100000]], "loss_mask": [[1, 1]], "messages": ["[]"]}, {})
    with pytest.raises(SpecdraftError, match="outside the vocabulary"):
        online_samples(ws["target"], tmp_path / "big")


def test_online_from_the_command_line(ws, tmp_path):
    from specdraft.train.__main__ import main

    out = tmp_path / "run"
    rc = main(["--online", "--prepared", str(ws["root"] / "data"), "--model", ws["model"], "--out", str(out),
               "--vocab", str(ws["root"] / "vocab.safetensors"), "--store", str(tmp_path / "no-store"),
               "--max-tokens", "40", "--epochs", "1", "--stop-after", "2", "--log-every", "1", "--no-progress",
               "--precision", "fp32"])
    assert rc == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert main(["--online", "--model", ws["model"], "--out", str(out)]) == 2      # --prepared missing: one line


@pytest.mark.parametrize("store_format", ["fp8", "compact"])
def test_online_batches_hold_what_a_store_of_that_format_holds(ws, tmp_path, store_format):
    """--online --store-format F: each batch's hidden states pass through F's encoding, so they are
    the batches of a store captured in F (up to one quantisation step where batch rounding differs)."""
    capture(ws["model"], ws["root"] / "data", tmp_path / "hidden", layers=LAYERS, dtype="float32",
            batch_tokens=256, target=ws["target"], progress=False, store_format=store_format)
    store = HiddenStore(tmp_path / "hidden")
    samples = online_samples(ws["target"], ws["root"] / "data", LAYERS, max_tokens=64, store_format=store_format)
    ids = list(range(len(store)))
    common = dict(max_tokens=64, rows_per_batch=2, seed=5, shuffle=True)
    for a, b in zip(StoreBatches(store, ids, **common).batches(0), OnlineBatches(samples, ids, **common).batches(0),
                    strict=True):
        assert a.keys() == b.keys() and ("teacher_ids" in a) == (store_format == "compact")
        step = a["aux"].abs().amax(-1, keepdim=True) / (7 if store_format == "compact" else 16)
        assert ((a["aux"] - b["aux"]).abs() <= step + 1e-6).all()
        if store_format == "compact":
            assert (a["teacher_ids"] == b["teacher_ids"]).float().mean() > 0.95
            torch.testing.assert_close(b["teacher_logp"][:, :, 0], a["teacher_logp"][:, :, 0], rtol=1e-2, atol=1e-2)
        else:
            assert ((a["last"] - b["last"]).abs() <= a["last"].abs().amax(-1, keepdim=True) / 16 + 1e-6).all()
