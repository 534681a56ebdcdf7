"""The hidden-state store on its own: format, atomic shards, hashes, memory-mapped reading."""

import json
from pathlib import Path

import pytest
import torch

from specdraft.data import store as st
from specdraft.errors import SpecdraftError

H = 16
TARGET = {"id": "tiny", "fingerprint": "f" * 32, "hidden_size": H}


def random_samples(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = 3 + (i * 7) % 11
        mask = (torch.rand(T, generator=g) > 0.5).to(torch.uint8)
        mask[-1] = 1   # every sample trains on at least one token (the store refuses one that does not)
        out.append({"input_ids": torch.randint(0, 1000, (T,), generator=g),
                    "loss_mask": mask,
                    "aux": torch.randn(T, 3, H, generator=g), "last": torch.randn(T, H, generator=g)})
    return out


def write_store(root: Path, samples: list[dict], shard_tokens: int = 40, dtype: str = "float32") -> dict:
    manifest = st.new_manifest(TARGET, [1, 2, 3], dtype, H, shard_tokens=shard_tokens)
    writer = st.StoreWriter(root, manifest)
    for start, end in st.plan_shards([len(s["input_ids"]) for s in samples], shard_tokens):
        part = samples[start:end]
        offsets = torch.tensor([0] + [len(s["input_ids"]) for s in part]).cumsum(0)
        writer.write_shard(torch.cat([s["aux"] for s in part]), torch.cat([s["last"] for s in part]),
                           torch.cat([s["input_ids"] for s in part]), torch.cat([s["loss_mask"] for s in part]),
                           offsets)
    writer.save(complete=True)
    return writer.manifest


def test_plan_shards_is_consecutive_and_bounded():
    lengths = [10, 20, 5, 50, 3, 3, 40]
    plan = st.plan_shards(lengths, 30)
    assert plan == [(0, 2), (2, 3), (3, 4), (4, 6), (6, 7)]
    assert plan[0][0] == 0 and plan[-1][1] == len(lengths)
    for (a, b), (c, _) in zip(plan, plan[1:]):
        assert b == c
    for a, b in plan:
        assert b - a == 1 or sum(lengths[a:b]) <= 30


def test_round_trip_fp32_exact(tmp_path):
    samples = random_samples(9)
    manifest = write_store(tmp_path / "hidden", samples)
    assert len(manifest["shards"]) > 1
    store = st.HiddenStore(tmp_path / "hidden", verify=True)
    assert len(store) == 9
    assert store.hidden_size == H and store.layer_ids == [1, 2, 3] and store.target == TARGET
    assert store.dtype == torch.float32
    assert store.sample_lengths == [len(s["input_ids"]) for s in samples]
    assert store.num_tokens == sum(store.sample_lengths)
    for i, s in enumerate(samples):
        got = store[i]
        assert got["input_ids"].dtype == torch.long
        assert torch.equal(got["input_ids"], s["input_ids"])
        assert torch.equal(got["loss_mask"], s["loss_mask"])
        assert torch.equal(got["aux"], s["aux"]) and got["aux"].shape == (len(s["input_ids"]), 3, H)
        assert torch.equal(got["last"], s["last"])
    assert torch.equal(store[-1]["last"], samples[-1]["last"])
    with pytest.raises(IndexError):
        store[9]


def test_shard_layout_and_manifest(tmp_path):
    from safetensors import safe_open

    samples = random_samples(5)
    manifest = write_store(tmp_path / "h", samples, shard_tokens=10_000, dtype="bfloat16")
    assert [e["file"] for e in manifest["shards"]] == ["shard-00000.safetensors"]
    assert manifest["shards"][0]["samples"] == [0, 5]
    on_disk = json.loads((tmp_path / "h" / "manifest.json").read_text())
    assert on_disk == manifest and on_disk["complete"] is True
    n = sum(len(s["input_ids"]) for s in samples)
    with safe_open(str(tmp_path / "h" / "shard-00000.safetensors"), "pt") as f:
        assert f.get_slice("aux").get_shape() == [n, 3, H]
        assert f.get_slice("aux").get_dtype() == "BF16"
        assert f.get_slice("last").get_shape() == [n, H]
        assert f.get_slice("input_ids").get_dtype() == "I64"
        assert f.get_slice("loss_mask").get_dtype() == "U8"
        assert f.get_tensor("offsets").tolist()[-1] == n
    got = st.HiddenStore(tmp_path / "h")[2]
    assert got["aux"].dtype == torch.bfloat16
    assert torch.equal(got["aux"], samples[2]["aux"].bfloat16())


def test_no_temp_files_left(tmp_path):
    write_store(tmp_path / "h", random_samples(6))
    assert not [p for p in (tmp_path / "h").iterdir() if p.name.startswith(".")]


def test_corrupt_shard_reported_by_name(tmp_path):
    write_store(tmp_path / "h", random_samples(9))
    shard = tmp_path / "h" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF                       # flip a byte inside the tensor data: header still valid
    shard.write_bytes(bytes(data))
    st.HiddenStore(tmp_path / "h")         # without verify nothing is hashed ...
    with pytest.raises(SpecdraftError, match="shard-00001.safetensors") as e:
        st.HiddenStore(tmp_path / "h", verify=True)
    assert "sha256" in str(e.value) and "shard-00000" not in str(e.value)
    with pytest.raises(SpecdraftError, match="shard-00001.safetensors"):
        st.verify_shards(tmp_path / "h")


def test_truncated_shard_is_one_line_error(tmp_path):
    write_store(tmp_path / "h", random_samples(9))
    shard = tmp_path / "h" / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(SpecdraftError, match="shard-00000.safetensors: corrupt or truncated") as e:
        st.HiddenStore(tmp_path / "h")   # every shard is opened (and checked) with the store
    assert "\n" not in str(e.value)


def test_missing_shard_named(tmp_path):
    write_store(tmp_path / "h", random_samples(9))
    (tmp_path / "h" / "shard-00001.safetensors").unlink()
    with pytest.raises(SpecdraftError, match="missing shard-00001.safetensors"):
        st.verify_shards(tmp_path / "h")


@pytest.mark.parametrize("bad", ["../outside.safetensors", "/etc/passwd", "sub/shard-00000.safetensors", ".."])
def test_manifest_path_outside_store_rejected(tmp_path, bad):
    write_store(tmp_path / "h", random_samples(4))
    path = tmp_path / "h" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][0]["file"] = bad
    path.write_text(json.dumps(manifest))
    with pytest.raises(SpecdraftError, match="points outside the store"):
        st.HiddenStore(tmp_path / "h")


def test_incomplete_and_foreign_manifests(tmp_path):
    write_store(tmp_path / "h", random_samples(4))
    path = tmp_path / "h" / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "complete": False}))
    with pytest.raises(SpecdraftError, match="--resume"):
        st.HiddenStore(tmp_path / "h")
    assert len(st.HiddenStore(tmp_path / "h", allow_incomplete=True)) == 4
    path.write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(SpecdraftError, match="format_version 99"):
        st.HiddenStore(tmp_path / "h")
    path.write_text("{not json")
    with pytest.raises(SpecdraftError, match="not valid JSON"):
        st.HiddenStore(tmp_path / "h")
    with pytest.raises(SpecdraftError, match="not found"):
        st.HiddenStore(tmp_path / "nowhere")


# ----------------------------------------------------------------------------- consistent with its hashes, not itself

def rewrite_shard(root: Path, index: int, **tensors) -> None:
    """Replace tensors of shard `index` and re-hash it in the manifest: a store whose hashes all
    match, so only its own consistency can refuse it."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = root / st.shard_name(index)
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    save_file({**load_file(str(path)), **tensors}, str(path), metadata=metadata)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["shards"][index]["sha256"] = st.sha256_file(path)
    (root / "manifest.json").write_text(json.dumps(manifest))


def edit_manifest(root: Path, **target) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["target"].update(target)
    (root / "manifest.json").write_text(json.dumps(manifest))


def offsets_not_increasing(root):
    from safetensors.torch import load_file
    off = load_file(str(root / st.shard_name(1)))["offsets"].clone()
    off[1], off[2] = off[2], off[1]
    rewrite_shard(root, 1, offsets=off)


def sample_without_trained_token(root):
    from safetensors.torch import load_file
    shard = load_file(str(root / st.shard_name(1)))
    mask, off = shard["loss_mask"].clone(), shard["offsets"]
    mask[off[1]:off[2]] = 0
    rewrite_shard(root, 1, loss_mask=mask)


def token_beyond_vocab(root):
    edit_manifest(root, vocab_size=1000)
    from safetensors.torch import load_file
    ids = load_file(str(root / st.shard_name(1)))["input_ids"].clone()
    ids[3] = 1000
    rewrite_shard(root, 1, input_ids=ids)


def negative_token(root):
    from safetensors.torch import load_file
    ids = load_file(str(root / st.shard_name(0)))["input_ids"].clone()
    ids[0] = -5
    rewrite_shard(root, 0, input_ids=ids)


def offsets_short_of_the_tokens(root):
    from safetensors.torch import load_file
    off = load_file(str(root / st.shard_name(0)))["offsets"].clone()
    off[-1] -= 1
    rewrite_shard(root, 0, offsets=off)


SELF_INCONSISTENT = [
    ("offsets not matching the shard's token count", offsets_short_of_the_tokens,
     r"shard-00000.safetensors: offsets disagree with the manifest"),
    ("offsets not increasing", offsets_not_increasing, r"shard-00001.safetensors: offsets are not increasing at sample"),
    ("a sample with no trained token", sample_without_trained_token,
     r"shard-00001.safetensors: sample \d+ has no trained token"),
    ("a token id beyond the target's vocabulary", token_beyond_vocab,
     r"shard-00001.safetensors: sample \d+ holds token id 1000, outside the target's vocabulary of 1000"),
    ("a negative token id", negative_token, r"shard-00000.safetensors: sample 0 holds token id -5"),
    ("aux layer ids beyond the target's layers", lambda root: edit_manifest(root, num_layers=3),
     r"manifest.json: field 'layer_ids' \[1, 2, 3\] reach beyond the target's 3 layers"),
    ("hidden size other than the target's", lambda root: edit_manifest(root, hidden_size=H * 2),
     r"manifest.json: field 'hidden_size' is 16 but the target's is 32"),
    ("target.vocab_size not a number", lambda root: edit_manifest(root, vocab_size="big"),
     r"manifest.json: field 'target.vocab_size' must be a positive integer"),
]


@pytest.mark.parametrize("name,damage,phrase", SELF_INCONSISTENT, ids=[c[0] for c in SELF_INCONSISTENT])
def test_store_consistent_with_its_hashes_but_not_itself_is_refused_at_open(tmp_path, name, damage, phrase):
    """Each store below passes `capture --verify` (every hash matches): only its own numbers disagree.
    It is refused when opened, by the store's file and sample, before any training or eval."""
    root = tmp_path / "h"
    write_store(root, random_samples(9))
    damage(root)
    if "manifest.json" not in phrase:
        st.verify_shards(root)   # the hashes match
    with pytest.raises(SpecdraftError, match=phrase) as e:
        st.HiddenStore(root)
    assert str(root) in str(e.value) and "\n" not in str(e.value)


def test_shard_ranges_with_gaps_or_overlaps_are_refused(tmp_path):
    root = tmp_path / "h"
    write_store(root, random_samples(9))
    manifest = json.loads((root / "manifest.json").read_text())
    for shift in (-1, 1):   # overlap with the previous shard, or a gap after it
        bad = json.loads(json.dumps(manifest))
        bad["shards"][1]["samples"][0] += shift
        (root / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(SpecdraftError, match="shard-00001.safetensors covers samples"):
            st.HiddenStore(root)


DAMAGED = "; the manifest is damaged or hand-edited: re-capture into an empty --out"
MANIFEST_TYPES = [   # (edit, the one line after "PATH: "): what the hand-written checks said, field by field
    (lambda m: m.pop("dtype"), "missing field 'dtype'; re-run capture"),
    (lambda m: m.update(target=None), "field 'target' must be an object naming the target (id, fingerprint), "
                                      "got null" + DAMAGED),
    (lambda m: m["target"].update(fingerprint=7), "field 'target' must be an object naming the target"),
    (lambda m: m["target"].update(num_layers=None), "field 'target.num_layers' must be a positive integer, "
                                                    "got null" + DAMAGED),
    (lambda m: m.update(layer_ids=[1, True]), "field 'layer_ids' must be a list of layer numbers, "
                                              "got [1, true]" + DAMAGED),
    (lambda m: m.update(layer_ids=[]), "field 'layer_ids' must be a list of layer numbers, got []" + DAMAGED),
    (lambda m: m.update(dtype="int8"), "field 'dtype' must be bfloat16, float16 or float32, got \"int8\"" + DAMAGED),
    (lambda m: m.update(hidden_size=0), "field 'hidden_size' must be a positive integer, got 0" + DAMAGED),
    (lambda m: m.update(num_tokens=-1), "field 'num_tokens' must be a non-negative integer, got -1" + DAMAGED),
    (lambda m: m.update(complete="yes"), "field 'complete' must be true or false, got \"yes\"" + DAMAGED),
    (lambda m: m.update(shards={}), "field 'shards' must be a list of shard entries, got {}" + DAMAGED),
    (lambda m: m["shards"].append(5), "malformed shard entry 5; re-run capture"),
    (lambda m: m["shards"][0].pop("sha256"), "malformed shard entry {'file': 'shard-00000.safetensors'"),
    (lambda m: m["shards"][0].update(file=3), "shard path 3 points outside the store"),
    (lambda m: (m.update(hidden_size=0), m["shards"][0].update(file="..")),     # the fields in the order read
     "field 'hidden_size' must be a positive integer, got 0" + DAMAGED),
    (lambda m: m["shards"][0].update(samples=[0, 1, 2]), "field 'samples' of shard shard-00000.safetensors must be "
                                                         "[start, end], got [0, 1, 2]" + DAMAGED),
    (lambda m: m["shards"][0].update(num_tokens="10"), "field 'num_tokens' of shard shard-00000.safetensors must be "
                                                       "a non-negative integer, got \"10\"" + DAMAGED),
    (lambda m: m["shards"][0].update(sha256=1), "field 'sha256' of shard shard-00000.safetensors must be a hex "
                                                "string, got 1" + DAMAGED),
]


@pytest.mark.parametrize("edit, line", MANIFEST_TYPES, ids=[line[:40] for _, line in MANIFEST_TYPES])
def test_each_wrong_manifest_field_is_its_one_line(tmp_path, edit, line):
    write_store(tmp_path / "h", random_samples(4))
    path = tmp_path / "h" / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(SpecdraftError) as e:
        st.read_manifest(tmp_path / "h")
    assert str(e.value).startswith(f"{path}: {line}") and "\n" not in str(e.value)
