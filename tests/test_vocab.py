"""Draft vocab: d2t offsets / t2d mask build, file I/O, diff, remap."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from specdraft import vocab
from specdraft.errors import SpecdraftError


def vocab_of(targets, vsize):
    """A Vocab from ascending absolute target ids."""
    targets = torch.as_tensor(sorted(targets), dtype=torch.long)
    t2d = torch.zeros(vsize, dtype=torch.bool)
    t2d[targets] = True
    return vocab.Vocab(targets - torch.arange(len(targets)), t2d, {"source": "test"})


def reference_top_n(counts, n):
    """Plain-Python statement of the rule: count desc, then id asc; first n; ascending."""
    ranked = sorted(range(len(counts)), key=lambda i: (-counts[i], i))
    return sorted(ranked[:n])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_build_properties_on_random_data(seed):
    rng = np.random.default_rng(seed)
    vsize, n = 300, 40
    ids = rng.integers(0, 60, size=5000) * 5 % vsize      # few distinct ids, many ties in counts
    mask = rng.integers(0, 2, size=ids.size)
    counts = vocab.count_tokens(ids, mask, vsize)
    assert counts.sum() == mask.sum()
    assert counts[ids[mask == 0][0]] >= 0
    d2t, t2d = vocab.mapping_from_counts(counts, n)
    targets = torch.arange(n) + d2t                        # offsets convention
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert int(t2d.sum()) == n
    assert bool((targets[1:] > targets[:-1]).all())        # draft ids follow ascending target id
    assert torch.equal(torch.nonzero(t2d).flatten(), targets)
    assert targets.tolist() == reference_top_n(counts.tolist(), n)


def test_ties_broken_by_lower_id():
    counts = np.array([0, 5, 3, 5, 3, 5, 0, 3])
    d2t, t2d = vocab.mapping_from_counts(counts, 4)
    assert (torch.arange(4) + d2t).tolist() == [1, 2, 3, 5]   # the three 5s, then the lowest-id 3


def test_fewer_distinct_tokens_pads_with_lowest_unused_ids():
    counts = vocab.count_tokens(np.array([9, 5, 3, 9, 7]), np.array([1, 1, 1, 1, 0]), 20)
    d2t, t2d = vocab.mapping_from_counts(counts, 6)
    assert (torch.arange(6) + d2t).tolist() == [0, 1, 2, 3, 5, 9]


def test_size_larger_than_target_vocab_names_both_numbers():
    with pytest.raises(SpecdraftError, match=r"--size 30.*20 tokens"):
        vocab.mapping_from_counts(np.zeros(20, dtype=np.int64), 30)


def make_prepared(folder, vocab_size=300):
    from specdraft.data.prepared import save_prepared

    rows = {"input_ids": [[1, 2, 3, 4, 5, 5], [5, 6, 7, 7, 7]],
            "loss_mask": [[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1]],
            "messages": ["[]", "[]"]}
    save_prepared(folder, rows, {"target": {"id": "tiny/target", "fingerprint": "abc", "vocab_size": vocab_size}})
    return folder


def test_build_from_prepared_data_writes_header(tmp_path):
    data = make_prepared(tmp_path / "data")
    out = tmp_path / "vocab.safetensors"
    summary = vocab.build_from_data(data, 3, out)
    # loss-masked tokens: 3,4,5,5 and 6,7,7,7 -> top 3 = 7 (3x), 5 (2x), then 3 (lowest id with 1)
    assert summary["distinct_tokens"] == 5 and summary["target_vocab_size"] == 300
    assert summary["coverage"] == pytest.approx(6 / 8)
    v = vocab.load(out)
    assert v.draft_to_target.tolist() == [3, 5, 7]
    assert v.meta["target_id"] == "tiny/target" and v.meta["fingerprint"] == "abc"
    assert v.meta["target_vocab_size"] == 300 and v.meta["draft_vocab_size"] == 3
    assert v.meta["format_version"] == 1
    first = out.read_bytes()
    vocab.build_from_data(data, 3, out)
    assert out.read_bytes() == first                      # deterministic bytes


def test_absolute_ids_rejected_naming_the_convention(tmp_path):
    v = vocab_of([4, 8, 15, 16], 32)
    bad = tmp_path / "abs.safetensors"
    save_file({"d2t": v.draft_to_target.clone(), "t2d": v.t2d}, str(bad))
    with pytest.raises(SpecdraftError, match=r"absolute target ids.*target_id = draft_id \+ d2t"):
        vocab.load(bad)
    # without t2d, absolute ids run past the vocab: also caught
    save_file({"d2t": torch.tensor([20, 25, 30, 31])}, str(bad), metadata={"target_vocab_size": "32"})
    with pytest.raises(SpecdraftError, match="absolute target ids"):
        vocab.load(bad)


def test_t2d_count_must_match(tmp_path):
    v = vocab_of([1, 2, 3], 10)
    t2d = v.t2d.clone()
    t2d[9] = True
    bad = tmp_path / "bad.safetensors"
    save_file({"d2t": v.d2t, "t2d": t2d}, str(bad))
    with pytest.raises(SpecdraftError, match="4 True entries but d2t has 3 rows"):
        vocab.load(bad)


def shifted_pair(n=100, k=7):
    """A = even ids; B keeps A's first k rows, then A's rows shifted by one, plus one new token.
    Exactly k positional matches, n-1 shared tokens."""
    a = [2 * i for i in range(n)]
    b = a[:k] + a[k + 1:] + [2 * n + 1]
    return vocab_of(a, 4 * n), vocab_of(b, 4 * n)


def test_diff_counts_positional_matches_exactly():
    a, b = shifted_pair(100, 7)
    d = vocab.diff(a, b)
    assert d["positional_matches"]["count"] == 7 and d["positional_matches"]["of"] == 100
    assert d["overlap"]["count"] == 99 and d["carried_rows"] == 99
    assert d["moved_rows"] == 92 and d["unsourced_rows"] == 1
    assert d["verdict"].startswith("scrambled: remap required") and d["remap_required"]
    assert vocab.diff(a, a)["verdict"] == "identical"
    text = vocab.format_diff(d)
    assert "7/100" in text and "scrambled" in text


def test_remap_moves_rows_so_predictions_match_the_target():
    torch.manual_seed(0)
    vsize, hidden = 200, 16
    target_head = torch.randn(vsize, hidden)                   # [V,H] the target's lm_head
    a = vocab_of(range(0, 120, 2), vsize)                      # even ids < 120
    b = vocab_of(list(range(10, 120, 2)) + list(range(121, 135, 2)), vsize)  # drops 5, adds 7 odd ids
    weight_a = target_head[a.draft_to_target]                  # a drafter that copies the target's rows
    new, counts = vocab.remap_lm_head(weight_a, a, b, fallback_rows_from_target=target_head)
    assert counts == {"carried": 55, "from_target": 7, "zeros": 0, "draft_vocab_size": 62}
    h = torch.randn(50, hidden)
    # B's drafter, mapped to target ids, must pick the target's argmax over B's token set
    drafted = b.draft_to_target[(h @ new.T).argmax(-1)]
    expected = b.draft_to_target[(h @ target_head[b.draft_to_target].T).argmax(-1)]
    assert torch.equal(drafted, expected)
    r = vocab.remap(a, b)
    have = r.src >= 0
    assert torch.equal(a.draft_to_target[r.src[have]], b.draft_to_target[have])
    assert r.unsourced == list(range(55, 62))
    zeros, counts = vocab.remap_lm_head(weight_a, a, b)
    assert counts["zeros"] == 7 and bool((zeros[55:] == 0).all())


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "specdraft.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_cli_diff_json_and_remap(tmp_path):
    a, b = shifted_pair(100, 7)
    vocab.save(a, tmp_path / "a.safetensors")
    vocab.save(b, tmp_path / "b.safetensors")
    p = run_cli("vocab", "diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["positional_matches"]["count"] == 7 and d["overlap"]["count"] == 99


def test_cli_remap_in_process(tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    a, b = shifted_pair(100, 7)
    vocab.save(a, tmp_path / "a.safetensors")
    vocab.save(b, tmp_path / "b.safetensors")
    res = CliRunner().invoke(app, ["vocab", "remap", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"),
                                   "--out", str(tmp_path / "remap.safetensors"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"carried": 99, "unsourced": 1, "draft_vocab_size": 100}
    from safetensors.torch import load_file
    assert torch.equal(load_file(str(tmp_path / "remap.safetensors"))["src"], vocab.remap(a, b).src)


def test_cli_size_too_large_is_one_line_rc2(tmp_path):
    data = make_prepared(tmp_path / "data", vocab_size=300)
    p = run_cli("vocab", "build", "--prepared", data, "--size", 1000, "--out", tmp_path / "v.safetensors")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "1000" in lines[0] and "300" in lines[0]
    assert not (tmp_path / "v.safetensors").exists()


def test_build_from_hidden_store(tmp_path):
    """The token-major store (manifest.json + shards) works as --store too."""
    store = tmp_path / "hidden"
    store.mkdir()
    save_file({"input_ids": torch.tensor([1, 2, 3, 3, 9, 9, 9]),
               "loss_mask": torch.tensor([0, 1, 1, 1, 0, 1, 1], dtype=torch.uint8)},
              str(store / "shard-00000.safetensors"))
    (store / "manifest.json").write_text(json.dumps(
        {"target": {"id": "t", "vocab_size": 16}, "shards": [{"file": "shard-00000.safetensors"}]}))
    summary = vocab.build_from_data(store, 2, tmp_path / "v.safetensors")
    assert vocab.load(tmp_path / "v.safetensors").draft_to_target.tolist() == [3, 9]
    assert summary["coverage"] == pytest.approx(4 / 5)


def test_build_counts_several_stores_together_and_refuses_two_targets(tmp_path, monkeypatch):
    """`vocab build --store A --store B`: the tokens of both stores counted as one (a second store of
    long documents brings tokens the first never has); stores of two targets are refused in one line."""
    def store(name, ids, mask, target="t", fingerprint=None):
        folder = tmp_path / name
        folder.mkdir()
        save_file({"input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask, dtype=torch.uint8)},
                  str(folder / "shard-00000.safetensors"))
        recorded = {"id": target, "vocab_size": 16, **({"fingerprint": fingerprint} if fingerprint else {})}
        (folder / "manifest.json").write_text(json.dumps(
            {"target": recorded, "shards": [{"file": "shard-00000.safetensors"}]}))
        return folder

    a, b = store("a", [3, 3, 3, 5], [1, 1, 1, 1]), store("b", [7, 7, 7, 7, 5], [1, 1, 1, 1, 1])
    vocab.build_from_data(a, 2, tmp_path / "a.safetensors")
    assert vocab.load(tmp_path / "a.safetensors").draft_to_target.tolist() == [3, 5]
    summary = vocab.build_from_data([a, b], 2, tmp_path / "ab.safetensors")
    assert vocab.load(tmp_path / "ab.safetensors").draft_to_target.tolist() == [3, 7]      # 7 only in b
    assert summary["loss_tokens"] == 9 and summary["distinct_tokens"] == 3
    other = store("other", [1, 2], [1, 1], target="another-model")
    with pytest.raises(SpecdraftError, match=r"other: holds the tokens of another-model .*, but .*a holds t's"):
        vocab.build_from_data([a, other], 2, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()
    # issue 57 class 3: two models saved under one folder name share an id, not a fingerprint
    c, d = store("c", [3, 3], [1, 1], "ws/model", "fp-one"), store("d", [7, 7], [1, 1], "ws/model", "fp-two")
    with pytest.raises(SpecdraftError, match=r"d: holds the tokens of ws/model \(fingerprint fp-two\), but .*fp-one"):
        vocab.build_from_data([c, d], 2, tmp_path / "y.safetensors")
    e = store("e", [5, 5], [1, 1], "elsewhere/same-model", "fp-one")          # the same weights under another name
    vocab.build_from_data([c, e], 2, tmp_path / "ce.safetensors")
    from typer.testing import CliRunner

    from specdraft.cli import app

    seen = {}
    monkeypatch.setattr(vocab, "build_from_data", lambda data, size, out, model=None, kind=None: seen.update(
        data=data, kind=kind) or {"draft_vocab_size": 2, "target_vocab_size": 16, "coverage": 1.0, "distinct_tokens": 3})
    res = CliRunner().invoke(app, ["vocab", "build", "--store", str(a), "--store", str(b), "--size", "2",
                                   "--out", str(tmp_path / "cli.safetensors")])
    assert res.exit_code == 0, res.output
    assert seen == {"data": [a, b], "kind": "store"}                     # the CLI passes every --store


def test_vocab_build_says_when_the_data_has_fewer_tokens_than_the_vocab():
    """--size 4096 from 321 distinct tokens said "covers 100.0%" and nothing else (issue 28)."""
    from specdraft.vocab import build_summary_lines

    summary = {"draft_vocab_size": 4096, "target_vocab_size": 49152, "coverage": 1.0, "distinct_tokens": 321}
    lines = build_summary_lines(summary, "ws/vocab.safetensors")
    assert "covers 100.0% of trained tokens" in lines[0]
    assert lines[1].startswith("warning: the data holds only 321 distinct trained tokens for --size 4096")
    assert len(build_summary_lines({**summary, "distinct_tokens": 5000}, "v")) == 1
