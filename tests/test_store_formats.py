"""Store formats (bf16, fp8, compact): round trip, hashes, resume mid-shard, conversion, and the
compact teacher's top-k read back as a draft-vocab distribution."""

import json
import math

import pytest
import torch

from specdraft.data import capture as cap
from specdraft.data import store as st
from specdraft.data import store_formats as sf
from specdraft.data.store_convert import convert_store
from specdraft.errors import SpecdraftError
from specdraft.train.objective import TeacherHead
from test_capture import cli, make_prepared, run, shard_hashes
from test_store import random_samples

H, V, K = 16, 1000, 8
TARGET = {"id": "tiny", "fingerprint": "f" * 32, "hidden_size": H, "vocab_size": V}


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest: tiny forwards, one thread


def head(seed: int = 1) -> sf.TopKTeacher:
    g = torch.Generator().manual_seed(seed)
    return sf.TopKTeacher(torch.ones(H), torch.randn(V, H, generator=g), 1e-6, k=K)


def write(root, samples, store_format, shard_tokens=40):
    manifest = st.new_manifest(TARGET, [1, 2, 3], "bfloat16", H, store_format=store_format, topk=K)
    writer = st.StoreWriter(root, manifest, head())
    for start, end in st.plan_shards([len(s["input_ids"]) for s in samples], shard_tokens):
        part = samples[start:end]
        offsets = torch.tensor([0] + [len(s["input_ids"]) for s in part]).cumsum(0)
        writer.write_shard(*(torch.cat([s[key] for s in part]) for key in ("aux", "last", "input_ids", "loss_mask")),
                           offsets)
    writer.save(complete=True)
    return writer.manifest


# relative error bound of each format on aux (bf16 ~0.4%, fp8 e4m3 ~6%, int4 in groups ~1/14 of the group max)
TOLERANCE = {"bf16": 0.01, "fp8": 0.07, "compact": 0.08}


@pytest.mark.parametrize("store_format", sf.FORMATS)
def test_each_format_round_trips_and_is_hashed(tmp_path, store_format):
    samples = random_samples(9)
    manifest = write(tmp_path / "s", samples, store_format)
    assert manifest["store_format"] == store_format and len(manifest["shards"]) > 1
    store = st.HiddenStore(tmp_path / "s", verify=True)
    assert store.store_format == store_format and len(store) == 9
    for i, want in enumerate(samples):
        got = store[i]
        assert torch.equal(got["input_ids"], want["input_ids"]) and torch.equal(got["loss_mask"], want["loss_mask"])
        assert got["aux"].shape == want["aux"].shape and got["aux"].dtype == torch.bfloat16
        scale = want["aux"].abs().amax(-1, keepdim=True)                 # per token row and layer
        assert ((got["aux"].float() - want["aux"]).abs() <= TOLERANCE[store_format] * scale).all()
        if store_format == "compact":
            ids, logp = head()(want["last"])
            assert "last" not in got and torch.equal(got["teacher_ids"], ids) and torch.equal(got["teacher_logp"], logp)
        else:
            scale = want["last"].abs().amax(-1, keepdim=True)
            assert ((got["last"].float() - want["last"]).abs() <= TOLERANCE[store_format] * scale).all()
    # the sha256 covers the stored bytes: one flipped byte is named by --verify, in one line
    shard = tmp_path / "s" / manifest["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[-5] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(SpecdraftError, match=f"sha256 mismatch in {shard.name}"):
        cap.verify_store(tmp_path / "s")


def test_bytes_per_token_measured_matches_formula(tmp_path):
    """At H=576 the shard files (headers aside) hold what the formula says; compact <= 0.30x bf16,
    and at H=7168 (by formula) compact <= 0.25x and fp8 ~0.5x."""
    H576, n = 576, 400
    g = torch.Generator().manual_seed(0)
    lm_head = torch.randn(V, H576, generator=g)
    measured = {}
    for name in sf.FORMATS:
        manifest = st.new_manifest({"id": "t", "fingerprint": "", "hidden_size": H576}, [1, 2, 3], "bfloat16", H576,
                                   store_format=name)
        writer = st.StoreWriter(tmp_path / name, manifest, sf.TopKTeacher(torch.ones(H576), lm_head, 1e-6))
        writer.write_shard(torch.randn(n, 3, H576, generator=g), torch.randn(n, H576, generator=g),
                           torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.uint8), torch.tensor([0, n]))
        measured[name] = (tmp_path / name / "shard-00000.safetensors").stat().st_size / n
        assert 0 <= measured[name] - sf.bytes_per_token(name, H576) < 4   # the header, spread over 400 tokens
    assert measured["compact"] <= 0.30 * measured["bf16"]
    assert sf.bytes_per_token("compact", 7168) <= 0.25 * sf.bytes_per_token("bf16", 7168)
    assert 0.45 <= sf.bytes_per_token("fp8", 7168) / sf.bytes_per_token("bf16", 7168) <= 0.55


def test_top_k_teacher_reads_back_as_the_draft_distribution():
    """With K = V the compact teacher is the full one (to fp16 rounding of its log-probs); with a small K
    its argmax is the same."""
    g = torch.Generator().manual_seed(0)
    lm_head, last = torch.randn(V, H, generator=g), torch.randn(20, H, generator=g) * 3
    d2t = torch.randperm(V, generator=g)[:300].sort().values - torch.arange(300)      # 300 draft tokens
    rows = torch.arange(300) + d2t
    full = TeacherHead(torch.ones(H), lm_head[rows], 1e-6, draft_of_target(rows))
    want = full.log_probs(last)
    ids, logp = sf.TopKTeacher(torch.ones(H), lm_head, 1e-6, k=V)(last)
    got = full.log_probs_from_top_k(ids, logp)
    assert torch.allclose(got, want, rtol=1e-3, atol=1e-3)     # fp16 log-probs: ~2^-11 relative
    ids, logp = sf.TopKTeacher(torch.ones(H), lm_head, 1e-6, k=32)(last)
    got = full.log_probs_from_top_k(ids, logp)
    in_draft = full.draft_of_target[ids.long()] >= 0
    assert torch.equal(got.argmax(-1)[in_draft.any(-1)], want.argmax(-1)[in_draft.any(-1)])


def draft_of_target(rows):
    out = torch.full((V,), -1, dtype=torch.long)
    out[rows] = torch.arange(len(rows))
    return out


@pytest.mark.parametrize("store_format", sf.FORMATS)
def test_resume_mid_shard_each_format(tiny_target, tmp_path, monkeypatch, store_format):
    """A capture killed while writing its third shard resumes to byte-identical shards."""
    from specdraft.targets import load_target

    prepared = make_prepared(tmp_path / "data", load_target(str(tiny_target)).identity)
    run(tiny_target, prepared, tmp_path / "full", store_format=store_format, dtype="bfloat16")
    expected = shard_hashes(tmp_path / "full")
    real_save = __import__("safetensors.torch", fromlist=["save_file"]).save_file
    calls = {"n": 0}

    def save_then_die(tensors, path, metadata=None):
        calls["n"] += 1
        if calls["n"] == 3:   # mid-shard: the temp file is half written when the process dies
            open(path, "wb").write(b"partial")
            raise KeyboardInterrupt
        return real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr("safetensors.torch.save_file", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_target, prepared, tmp_path / "killed", store_format=store_format, dtype="bfloat16")
    monkeypatch.undo()
    assert len(shard_hashes(tmp_path / "killed")) == 2
    with pytest.raises(SpecdraftError, match="store_format"):
        run(tiny_target, prepared, tmp_path / "killed", resume=True, dtype="bfloat16",
            store_format=next(f for f in sf.FORMATS if f != store_format))
    manifest = run(tiny_target, prepared, tmp_path / "killed", resume=True, store_format=store_format, dtype="bfloat16")
    assert shard_hashes(tmp_path / "killed") == expected and manifest["store_format"] == store_format
    assert cap.verify_store(tmp_path / "killed")["shards"] == len(expected)


def test_convert_to_each_format(tiny_target, tmp_path, monkeypatch, capsys):
    from specdraft.targets import load_target

    prepared = make_prepared(tmp_path / "data", load_target(str(tiny_target)).identity)
    run(tiny_target, prepared, tmp_path / "bf16", dtype="bfloat16")
    code, err = cli(monkeypatch, capsys, "store", "convert", tmp_path / "bf16", "--store-format", "compact",
                    "--out", tmp_path / "compact", "--model", tiny_target)
    assert code == 0 and "converted 12 samples" in err, err
    direct = run(tiny_target, prepared, tmp_path / "direct", dtype="bfloat16", store_format="compact")
    converted = json.loads((tmp_path / "compact" / "manifest.json").read_text())
    assert [e["samples"] for e in converted["shards"]] == [e["samples"] for e in direct["shards"]]
    a, b = st.HiddenStore(tmp_path / "compact", verify=True), st.HiddenStore(tmp_path / "direct")
    assert torch.equal(a[3]["aux"], b[3]["aux"]) and torch.equal(a[3]["teacher_ids"], b[3]["teacher_ids"])
    convert_store(tmp_path / "bf16", tmp_path / "fp8", "fp8")
    assert st.HiddenStore(tmp_path / "fp8").store_format == "fp8"
    code, err = cli(monkeypatch, capsys, "store", "convert", tmp_path / "compact", "--store-format", "fp8",
                    "--out", tmp_path / "back")
    assert code == 2 and "cannot become fp8" in err and "Traceback" not in err


def test_training_from_each_format_tracks_bf16(tiny_target, tmp_path):
    """The same run (seed, samples) from each format: compact and fp8 train, and their validation
    metrics stay near the bf16 store's (the tiny random target's flat distributions are the hard case
    for a top-k teacher: most of its mass is outside the top 32)."""
    from specdraft import vocab as vocab_mod
    from specdraft.targets import load_target
    from specdraft.train.config import RunConfig
    from specdraft.train.loop import train

    target = load_target(str(tiny_target))
    prepared = make_prepared(tmp_path / "data", target.identity)
    for name in sf.FORMATS:
        run(tiny_target, prepared, tmp_path / name, dtype="bfloat16", store_format=name, layers=[1, 3, 5])
    store = st.HiddenStore(tmp_path / "bf16")
    ids = torch.cat([store[i]["input_ids"] for i in range(len(store))]).numpy()
    mask = torch.cat([store[i]["loss_mask"] for i in range(len(store))]).numpy()
    d2t, t2d = vocab_mod.mapping_from_counts(vocab_mod.count_tokens(ids, mask, target.vocab_size), 48)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {"target_id": target.name, "fingerprint": target.identity["fingerprint"]}),
                   tmp_path / "vocab.safetensors")
    val, last_train = {}, {}
    for name in sf.FORMATS:
        cfg = RunConfig(out=str(tmp_path / f"run-{name}"), store=str(tmp_path / name), model=str(tiny_target),
                        vocab=str(tmp_path / "vocab.safetensors"), max_tokens=64, epochs=2, lr=2e-3, warmup_steps=2,
                        log_every=1, val_fraction=0.25, progress=False, precision="fp32", seed=3)
        val[name] = train(cfg)["val"]
        lines = (tmp_path / f"run-{name}" / "metrics.jsonl").read_text().splitlines()
        last_train[name] = [json.loads(x) for x in lines if json.loads(x)["split"] == "train"][-1]["metrics"]
        bf16 = train(cfg.replace(out=str(tmp_path / f"bf16-{name}"), epochs=1, precision="bf16"))  # autocast over stored rows
        assert math.isfinite(bf16["val"]["loss"]), name
    print({name: (round(val[name]["loss"], 4), round(last_train[name]["accept_len"], 4)) for name in val})
    assert abs(val["fp8"]["loss"] - val["bf16"]["loss"]) <= 0.01 * val["bf16"]["loss"]
    assert abs(val["compact"]["loss"] - val["bf16"]["loss"]) <= 0.05 * val["bf16"]["loss"]
    for name in ("fp8", "compact"):
        assert abs(val[name]["accept_len"] - val["bf16"]["accept_len"]) <= 0.03
        assert abs(last_train[name]["accept_len"] - last_train["bf16"]["accept_len"]) <= 0.1


def test_bad_format_options_are_one_line_exit_2(tiny_target, tmp_path, monkeypatch, capsys):
    code, err = cli(monkeypatch, capsys, "capture", "--model", tiny_target, "--prepared", tmp_path / "none",
                    "--out", tmp_path / "h", "--store-format", "int3")
    assert code == 2 and "--store-format int3: unknown; use bf16, fp8, compact" in err and "Traceback" not in err
    code, err = cli(monkeypatch, capsys, "train", "--store-format", "fp8", "--out", tmp_path / "run")
    assert code == 2 and "only with --online" in err and "Traceback" not in err


def test_vllm_capture_reads_the_teacher_head_from_the_checkpoint(tiny_target):
    """A vLLM capture has no weights in this process: compact's top-k then comes from the norm and
    lm_head read from the checkpoint, and equals the loaded model's."""
    from types import SimpleNamespace

    from specdraft.targets import load_target

    target = load_target(str(tiny_target))
    manifest = st.new_manifest(target.identity, [1, 2, 3], "bfloat16", target.hidden_size, store_format="compact")
    loaded = cap.top_k_teacher(manifest, target, str(tiny_target), "cpu", False)
    from_checkpoint = cap.top_k_teacher(manifest, SimpleNamespace(model=None), str(tiny_target), "cpu", False)
    last = torch.randn(10, target.hidden_size, generator=torch.Generator().manual_seed(0))
    ids_a, logp_a = loaded(last)
    ids_b, logp_b = from_checkpoint(last)
    assert torch.equal(ids_a, ids_b) and torch.allclose(logp_a.float(), logp_b.float(), atol=1e-3)
    assert cap.top_k_teacher(st.new_manifest(target.identity, [1], "bfloat16", target.hidden_size), target,
                             str(tiny_target), "cpu", False) is None
