"""probe: vocab mappings with a known number of positional matches, CKA/cosine math, and the
hidden-state probe on tiny targets (identical vs perturbed)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specdraft import vocab
from specdraft import journal
from specdraft.analysis import probe
from specdraft.errors import SpecdraftError


def write_mapping(path, target_ids, target_vocab=1000):
    ids = torch.tensor(sorted(target_ids), dtype=torch.long)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[ids] = True
    vocab.save(vocab.Vocab(ids - torch.arange(len(ids)), t2d), path)
    return path


@pytest.mark.parametrize("n,matches,vsize", [(100, 0, 1000), (100, 7, 1000), (100, 63, 1000),
                                              (32000, 252, 163840)])   # the seed: 252/32000
def test_vocab_probe_counts_positional_matches_exactly(tmp_path, n, matches, vsize):
    a = write_mapping(tmp_path / "a.safetensors", range(n), vsize)
    # B keeps A's first `matches` tokens, then skips one token: every later row is shifted by one
    b = write_mapping(tmp_path / "b.safetensors", list(range(matches)) + list(range(matches + 1, n + 1)), vsize)
    r = probe.probe_vocabs(a, b)
    assert r["positional_matches"]["count"] == matches
    assert r["overlap"]["count"] == n - 1
    want = "scrambled: remap required" if matches / n < 0.5 else "partly aligned: remap required"
    assert r["verdict"].startswith(want)
    text = probe.format_result(r)
    assert f"positional matches:   {matches}/{n}" in text


def test_vocab_probe_identical_and_disjoint(tmp_path):
    a = write_mapping(tmp_path / "a.safetensors", range(0, 200, 2))
    assert probe.probe_vocabs(a, a)["verdict"] == "identical"
    b = write_mapping(tmp_path / "b.safetensors", range(1, 200, 2))
    r = probe.probe_vocabs(a, b)
    assert r["positional_matches"]["count"] == 0 and r["overlap"]["count"] == 0
    assert "scrambled" in r["verdict"] and "from scratch" in r["verdict"]


def test_cli_probe_vocab_writes_json_and_journal(tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    a = write_mapping(tmp_path / "a.safetensors", range(100))
    b = write_mapping(tmp_path / "b.safetensors", [0, 1, 2] + list(range(4, 101)))
    run = tmp_path / "run"                      # probe comes before fine-tuning: its run is made (with a note)
    res = CliRunner().invoke(app, ["probe", "--vocab", str(a), "--vocab", str(b), "--run", str(run)])
    assert res.exit_code == 0, res.output
    assert "positional matches:   3/100" in res.output
    saved = json.loads((run / "probe-vocab.json").read_text())
    assert saved["positional_matches"]["count"] == 3
    [entry] = journal.read(run)
    assert entry.kind == "probe" and entry.source == "probe" and "scrambled" in entry.text
    res = CliRunner().invoke(app, ["probe", "--vocab", str(a)])
    assert res.exit_code != 0


def test_linear_cka_properties():
    g = torch.Generator().manual_seed(0)
    for n, d in ((50, 16), (16, 50)):        # both the feature form and the Gram form
        x = torch.randn(n, d, generator=g, dtype=torch.float64)
        q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
        assert probe.linear_cka(x, 3.0 * x @ q + 5.0) == pytest.approx(1.0, abs=1e-9)
        y = torch.randn(n, d, generator=g, dtype=torch.float64)
        assert probe.linear_cka(x, y) < 0.8
    x = torch.randn(40, 8, generator=g, dtype=torch.float64)
    y = torch.randn(40, 8, generator=g, dtype=torch.float64)
    # the two forms agree
    assert probe.linear_cka(x, y) == pytest.approx(probe.linear_cka(x[:, :8].repeat(1, 1), y), rel=1e-9)
    s = probe.layer_stats("aux 1", x, -x)
    assert s.cosine == pytest.approx(-1.0) and s.cka == pytest.approx(1.0) and s.std_ratio == pytest.approx(1.0)
    assert s.mean_shift > 0


def test_hidden_verdict_bands():
    mk = lambda cos, cka: [probe.LayerStats("aux 2", 0.0, 1.0, cos, cka), probe.LayerStats("last", 0, 1, 0, 0)]
    assert probe.hidden_verdict(mk(0.97, 0.95)).startswith("close")
    assert probe.hidden_verdict(mk(0.3, 0.95)).startswith("same information")
    assert probe.hidden_verdict(mk(0.3, 0.4)).startswith("far")
    assert probe.hidden_verdict(mk(0.7, 0.7)).startswith("uncertain")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from specdraft.data.prepared import save_prepared

    g = torch.Generator().manual_seed(1)
    out = tmp_path_factory.mktemp("data") / "data"
    rows = {"input_ids": [], "loss_mask": [], "messages": []}
    for n in (40, 64, 33, 50):
        rows["input_ids"].append(torch.randint(7, 263, (n,), generator=g).tolist())
        rows["loss_mask"].append([0] * (n // 2) + [1] * (n - n // 2))
        rows["messages"].append("[]")
    save_prepared(out, rows, {"target": {}})
    return out


def perturbed_copy(src, dst, scale):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(scale * p.std() * torch.randn(p.shape, generator=g))
    model.save_pretrained(dst)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, dst / f.name)
    return dst


def test_hidden_probe_identical_vs_perturbed(tmp_path, tiny_target, prepared):
    same = probe.probe_hidden(str(tiny_target), str(tiny_target), prepared, samples=4)
    assert [s["layer"] for s in same["layers"]] == ["aux 2", "aux 4", "aux 5", "last"]
    assert same["positions"] == 20 + 32 + 17 + 25          # loss-masked tokens only
    for s in same["layers"]:
        assert s["cosine"] == pytest.approx(1.0, abs=1e-5) and s["cka"] == pytest.approx(1.0, abs=1e-5)
        assert s["mean_shift"] == pytest.approx(0.0, abs=1e-5)
    assert same["verdict"].startswith("close")
    mild = probe.probe_hidden(str(tiny_target), str(perturbed_copy(tiny_target, tmp_path / "mild", 0.2)),
                              prepared, samples=4)
    far = probe.probe_hidden(str(tiny_target), str(perturbed_copy(tiny_target, tmp_path / "far", 3.0)),
                             prepared, samples=4)
    for m, f in zip(mild["layers"], far["layers"]):
        assert 1.0 > m["cosine"] > f["cosine"] and m["cka"] > f["cka"]
    assert far["verdict"].startswith(("far", "uncertain"))
    assert not far["verdict"].startswith("close")


def test_hidden_probe_bad_input(tmp_path, tiny_target, prepared):
    with pytest.raises(SpecdraftError, match="two targets"):
        probe.run(vocabs=[], models=[str(tiny_target)], data=prepared, drafter=None)
    with pytest.raises(SpecdraftError, match="prepared data folder not found"):
        probe.probe_hidden(str(tiny_target), str(tiny_target), tmp_path / "nope")
