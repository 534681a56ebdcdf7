"""`capture` on the tiny random Llama: layer semantics, resume, refusals."""

import json
import sys
from pathlib import Path

import pytest
import torch

from specdraft.data import capture as cap
from specdraft.data import store as st
from specdraft.data.prepared import save_prepared
from specdraft.errors import SpecdraftError
from specdraft.io import sha256_file
from specdraft.targets import load_target

LENGTHS = [5, 17, 9, 33, 12, 3, 28, 20, 7, 14, 25, 11]


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest: tiny forwards, one thread


@pytest.fixture(scope="module")
def target(tiny_target):
    return load_target(str(tiny_target))


def make_prepared(folder: Path, identity: dict | None, lengths=LENGTHS, seed: int = 0, vocab: int = 263) -> Path:
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(7, vocab, (n,), generator=g).tolist() for n in lengths]
    masks = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    meta = {"source": "test", "counts": {"samples": len(lengths), "tokens": sum(lengths)}}
    if identity is not None:
        meta["target"] = identity
    save_prepared(folder, {"input_ids": ids, "loss_mask": masks, "messages": ["[]"] * len(lengths)}, meta)
    return folder


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, target):
    return make_prepared(tmp_path_factory.mktemp("data") / "data", target.identity)


def run(tiny_target, data, out, **kw):
    kw.setdefault("dtype", "float32")
    kw.setdefault("batch_tokens", 64)
    kw.setdefault("shard_tokens", 60)
    return cap.capture(model=str(tiny_target), data=data, out=out, progress=False, **kw)


def shard_hashes(out: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(out.glob("shard-*.safetensors"))}


def test_length_batches_bucket_and_cover():
    lengths = [5, 40, 7, 38, 6, 100]
    batches = cap.length_batches(lengths, 80)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert batches[0] == [5]                      # longer than the budget: alone
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 80


def test_capture_matches_hf_hidden_states(tiny_target, prepared, target, tmp_path):
    out = tmp_path / "hidden"
    manifest = run(tiny_target, prepared, out, layers=[0, 3, 5])
    assert manifest["num_samples"] == len(LENGTHS) and manifest["num_tokens"] == sum(LENGTHS)
    assert len(manifest["shards"]) > 2 and manifest["complete"]
    assert manifest["layer_ids"] == [0, 3, 5] and manifest["target"] == target.identity
    assert cap.verify_store(out) == {"shards": len(manifest["shards"]), "samples": len(LENGTHS),
                                     "tokens": sum(LENGTHS)}
    store = st.HiddenStore(out, verify=True)
    assert store.sample_lengths == LENGTHS
    from specdraft.data.prepared import load_prepared
    ds, _ = load_prepared(prepared)
    model = target.model
    for i in range(len(LENGTHS)):
        ids = torch.tensor(ds[i]["input_ids"])
        with torch.no_grad():
            hs = model(ids[None], output_hidden_states=True).hidden_states   # L+1 entries
        got = store[i]
        assert torch.equal(got["input_ids"], ids)                          # prepared order kept
        assert got["loss_mask"].tolist() == ds[i]["loss_mask"]
        for slot, lid in enumerate([0, 3, 5]):
            torch.testing.assert_close(got["aux"][:, slot], hs[lid][0], atol=1e-5, rtol=1e-5)
        last = got["last"]
        # `last` is the pre-norm output of the last layer, not HF's final (post-norm) entry ...
        assert not torch.allclose(last, hs[-1][0], atol=1e-2)
        # ... and the final norm of it is exactly that entry.
        with torch.no_grad():
            torch.testing.assert_close(model.model.norm(last), hs[-1][0], atol=1e-5, rtol=1e-5)


def test_default_layers_bf16(tiny_target, prepared, target, tmp_path):
    out = tmp_path / "hidden"
    manifest = run(tiny_target, prepared, out, dtype="bfloat16", shard_tokens=1000)
    assert manifest["layer_ids"] == [2, 4, 5] and manifest["dtype"] == "bfloat16"   # [2, L//2, L-3], L=8
    store = st.HiddenStore(out)
    got = store[3]
    assert got["aux"].dtype == torch.bfloat16
    ids = got["input_ids"]
    with torch.no_grad():
        hs = target.model(ids[None], output_hidden_states=True).hidden_states
    for slot, lid in enumerate([2, 4, 5]):
        torch.testing.assert_close(got["aux"][:, slot].float(), hs[lid][0], atol=2e-2, rtol=1e-2)
    # the target itself may run in bf16 too (close to, not equal to, the fp32 capture)
    run(tiny_target, prepared, tmp_path / "bf16-compute", dtype="bfloat16", compute_dtype="bfloat16")
    bf = st.HiddenStore(tmp_path / "bf16-compute")[3]
    torch.testing.assert_close(bf["last"].float(), got["last"].float(), atol=0.1, rtol=0.05)


def test_interrupted_capture_resumes_identically(tiny_target, prepared, tmp_path, monkeypatch):
    full = tmp_path / "full"
    run(tiny_target, prepared, full)
    expected = shard_hashes(full)
    assert len(expected) >= 4

    out = tmp_path / "killed"
    real_write = st.StoreWriter.write_shard
    calls = {"n": 0}

    def write_then_die(self, *a, **k):
        if calls["n"] == 2:
            raise KeyboardInterrupt
        calls["n"] += 1
        return real_write(self, *a, **k)

    monkeypatch.setattr(st.StoreWriter, "write_shard", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_target, prepared, out)
    monkeypatch.undo()
    assert len(shard_hashes(out)) == 2
    with pytest.raises(SpecdraftError, match="did not finish"):
        st.HiddenStore(out)
    with pytest.raises(SpecdraftError, match="--resume"):
        run(tiny_target, prepared, out)           # no silent overwrite of a partial store
    # a resume with another --batch-tokens still reproduces the stored layout
    manifest = run(tiny_target, prepared, out, resume=True, batch_tokens=4096)
    assert shard_hashes(out) == expected
    assert [e["sha256"] for e in manifest["shards"]] == list(expected.values())
    assert json.loads((out / "manifest.json").read_text()) == json.loads((full / "manifest.json").read_text()) | {
        "data": manifest["data"]}

    # deleted trailing shards (and a corrupted middle one) are re-captured from the first bad shard
    names = sorted(expected)
    (out / names[-1]).unlink()
    (out / names[-2]).unlink()
    bad = out / names[1]
    bad.write_bytes(bad.read_bytes()[:-10] + b"\0" * 10)
    with pytest.raises(SpecdraftError, match=names[1]):
        cap.verify_store(out)
    run(tiny_target, prepared, out, resume=True)
    assert shard_hashes(out) == expected
    assert cap.verify_store(out)["samples"] == len(LENGTHS)


def test_refusals(tiny_target, prepared, target, tmp_path):
    out = tmp_path / "hidden"
    with pytest.raises(SpecdraftError, match="aux layer id 8 out of range"):
        run(tiny_target, prepared, out, layers=[2, 4, 8])
    with pytest.raises(SpecdraftError, match="distinct aux layer ids"):
        run(tiny_target, prepared, out, layers=[2, 2, 4])
    with pytest.raises(SpecdraftError, match="--store-dtype int8"):
        run(tiny_target, prepared, out, dtype="int8")
    run(tiny_target, prepared, out)
    with pytest.raises(SpecdraftError, match="pass --resume"):
        run(tiny_target, prepared, out)
    with pytest.raises(SpecdraftError, match="layer_ids"):
        run(tiny_target, prepared, out, resume=True, layers=[1, 2, 3])
    with pytest.raises(SpecdraftError, match="shard_tokens"):
        run(tiny_target, prepared, out, resume=True, shard_tokens=61)
    with pytest.raises(SpecdraftError, match="--compute-dtype float32"):
        run(tiny_target, prepared, out, resume=True, compute_dtype="bfloat16")
    other = make_prepared(tmp_path / "other", target.identity, seed=5)
    with pytest.raises(SpecdraftError, match="other prepared data"):
        run(tiny_target, other, out, resume=True)


def test_mismatched_target_refused(tiny_target, target, tmp_path):
    from specdraft.testing import save_tiny_target

    other = save_tiny_target(tmp_path / "other-target", seed=1)
    # data prepared for the tiny target, captured with another one
    data = make_prepared(tmp_path / "data", target.identity)
    with pytest.raises(SpecdraftError, match="prepared for") as e:
        run(other, data, tmp_path / "h1")
    assert target.identity["fingerprint"] in str(e.value) and str(other) in str(e.value)
    # a store captured from the tiny target, resumed with the other one
    untagged = make_prepared(tmp_path / "untagged", None)
    run(tiny_target, untagged, tmp_path / "h2")
    with pytest.raises(SpecdraftError, match="store was captured from") as e:
        run(other, untagged, tmp_path / "h2", resume=True)
    assert str(tiny_target) in str(e.value) and str(other) in str(e.value)


def test_nonfinite_hidden_state_names_the_sample(tiny_target, tmp_path):
    target = load_target(str(tiny_target))
    lengths = [6, 6, 6, 6]
    data = make_prepared(tmp_path / "data", target.identity, lengths=lengths)
    from specdraft.data.prepared import load_prepared
    ds, _ = load_prepared(data)
    poison = ds[2]["input_ids"][3]
    assert all(poison not in ds[i]["input_ids"] for i in (0, 1))
    with torch.no_grad():
        target.model.model.embed_tokens.weight[poison] = float("nan")
    with pytest.raises(SpecdraftError, match="sample 2: non-finite"):
        cap.capture(model=str(tiny_target), data=data, out=tmp_path / "h", dtype="float32",
                    shard_tokens=12, target=target, progress=False)


@pytest.mark.parametrize("layers", [[2], [1, 3], [1, 2, 4, 5]])
def test_nonfinite_names_the_aux_layer_for_any_aux_count(layers):
    """One, two or four aux layers: the line names the poisoned one (was an IndexError with fewer
    than three, and a fourth was never named)."""
    aux, last = torch.zeros(8, len(layers), 4), torch.zeros(8, 4)
    aux[5, -1, 0] = float("nan")
    with pytest.raises(SpecdraftError, match=rf"sample 1: .* at token 1 in aux layer {layers[-1]};"):
        cap.check_finite(aux, last, torch.tensor([0, 4, 8]), layers, 0)


def test_disk_preflight(tiny_target, prepared, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(SpecdraftError, match="not enough disk space") as e:
        run(tiny_target, prepared, tmp_path / "h")
    assert f"{sum(LENGTHS):,} tokens x 4 x 64" in str(e.value)
    assert not list((tmp_path / "h").glob("shard-*"))


def cli(monkeypatch, capsys, *args) -> tuple[int, str]:
    """Run `specdraft ARGS` in-process through main() (exit code, stderr)."""
    from specdraft import cli as cli_module

    monkeypatch.setattr(sys, "argv", ["specdraft", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        cli_module.main()
    return e.value.code or 0, capsys.readouterr().err


def test_cli_capture_and_verify(tiny_target, prepared, tmp_path, monkeypatch, capsys):
    out = tmp_path / "hidden"
    code, err = cli(monkeypatch, capsys, "capture", "--model", tiny_target, "--prepared", prepared, "--out", out,
                    "--shard-tokens", 50, "--layers", "1,2,3")
    assert code == 0 and "captured 12 samples" in err, err
    assert st.HiddenStore(out).layer_ids == [1, 2, 3]
    code, err = cli(monkeypatch, capsys, "capture", "--out", out, "--verify")
    assert code == 0 and "verified" in err, err
    code, err = cli(monkeypatch, capsys, "capture", "--model", tiny_target, "--prepared", prepared, "--out", out)
    assert code == 2 and "--resume" in err and "Traceback" not in err
    shard = out / "shard-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 1
    shard.write_bytes(bytes(data))
    code, err = cli(monkeypatch, capsys, "capture", "--out", out, "--verify")
    assert code == 2 and "shard-00002.safetensors" in err and "Traceback" not in err


def test_any_number_of_aux_layers_is_captured(tiny_target, prepared, tmp_path):
    """--layers takes any count (EAGLE-3's default is 3; a family may ask for more): the store keeps
    one aux slot per layer and says so in its manifest."""
    from specdraft.data.store import HiddenStore

    for layers in ([3], [1, 2, 4, 5]):
        out = tmp_path / f"hidden-{len(layers)}"
        run(tiny_target, prepared, out, layers=layers)
        store = HiddenStore(out)
        assert store.layer_ids == layers and store[0]["aux"].shape[1:] == (len(layers), store.hidden_size)


def test_capture_runs_the_target_on_the_gpu_where_there_is_one(tiny_target, prepared, tmp_path, monkeypatch):
    """`--device auto` (the default) loads transformers' target on CUDA when present: an H200 captured at
    2.9K tok/s while its regeneration ran at 6.5K, because capture always loaded the target on the CPU.
    `--device cuda` without CUDA is refused in one line."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SpecdraftError, match="--device cuda: CUDA is not available here"):
        run(tiny_target, prepared, tmp_path / "no-cuda", device="cuda")
    loaded_on = []

    def fake_load(model, dtype="float32", device="cpu", trust_remote_code=False):
        loaded_on.append(device)
        raise RuntimeError("stop after the load")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cap, "load_target", fake_load)
    with pytest.raises(RuntimeError, match="stop after the load"):
        run(tiny_target, prepared, tmp_path / "gpu")
    assert loaded_on == ["cuda"]


def test_auto_compute_dtype_is_measured_recorded_and_kept_on_resume(tiny_target, prepared, tmp_path, monkeypatch):
    """capture --compute-dtype auto (the CLI's default): float32 in the suite (SPECDRAFT_KERNEL_PATH=linear,
    the same store on every machine); where bf16 measures faster (AMX) bf16, recorded in the manifest;
    a resumed store keeps the dtype it was started in whatever this machine would measure."""
    from specdraft import dtypes

    assert run(tiny_target, prepared, tmp_path / "suite", compute_dtype="auto")["compute_dtype"] == "float32"
    monkeypatch.setenv("SPECDRAFT_KERNEL_PATH", "")
    asked = []
    monkeypatch.setattr(dtypes, "faster_dtype", lambda shapes, rows: asked.append(rows) or ("bfloat16", {}))
    out = tmp_path / "amx"
    stop = {"n": 0}
    real_write = st.StoreWriter.write_shard

    def interrupt(self, *a, **kw):          # one shard written, then the machine goes away
        stop["n"] += 1
        if stop["n"] == 2:
            raise KeyboardInterrupt
        return real_write(self, *a, **kw)

    monkeypatch.setattr(st.StoreWriter, "write_shard", interrupt)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_target, prepared, out, compute_dtype="auto")
    assert asked == [64] and json.loads((out / "manifest.json").read_text())["compute_dtype"] == "bfloat16"
    monkeypatch.setattr(st.StoreWriter, "write_shard", real_write)
    monkeypatch.setattr(dtypes, "faster_dtype", lambda shapes, rows: ("float32", {}))   # another machine now
    assert run(tiny_target, prepared, out, compute_dtype="auto", resume=True)["compute_dtype"] == "bfloat16"
