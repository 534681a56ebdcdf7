"""RUN/provenance.json (issue 16): what produced a run, written by rank 0 when train starts."""

import json
import os
import platform
import sys

import pytest

from specdraft import __version__
from specdraft.run_layout import PROVENANCE
from specdraft.train.provenance import write_provenance

from bad_workspace import run_cli, ws  # noqa: F401  (ws is a fixture)


def test_train_writes_provenance(ws, monkeypatch, capsys):
    out = ws["root"] / "run-prov"
    argv = ["train", "--model", ws["target"], "--store", ws["root"] / "hidden", "--vocab",
            ws["root"] / "vocab.safetensors", "--out", out, "--epochs", "1", "--max-tokens", "64",
            "--val-fraction", "0", "--precision", "fp32", "--no-progress"]
    code, err, _ = run_cli(monkeypatch, capsys, argv)
    assert code == 0, err
    p = json.loads((out / PROVENANCE).read_text())
    assert p["command"] == ["specdraft", *map(str, argv)]
    assert p["packages"]["specdraft"] == __version__
    assert {"torch", "transformers", "safetensors", "datasets"} <= set(p["packages"])
    assert p["torch"]["threads"] >= 1 and p["torch"]["device"] == "cpu" and p["torch"]["world_size"] == 1
    assert p["host"]["cpu_count"] == os.cpu_count() and p["python"] == platform.python_version()
    assert p["time"][:2] == "20"
    assert len(p["git"]["commit"]) == 40 and isinstance(p["git"]["dirty"], bool)   # tests run from a checkout

    # --resume keeps the first invocation under "earlier"
    code, err, _ = run_cli(monkeypatch, capsys, ["train", "--out", out, "--resume", "--epochs", "2", "--no-progress"])
    assert code == 0, err
    again = json.loads((out / PROVENANCE).read_text())
    assert again["earlier"] == [p] and "--resume" in again["command"]


def test_no_git_outside_a_checkout(tmp_path, monkeypatch):
    import specdraft.train.provenance as prov

    assert prov.git_commit(tmp_path) is None                       # not a repository: quietly absent
    monkeypatch.setattr(prov, "git_commit", lambda: None)
    record = write_provenance(tmp_path, "cpu")
    assert "git" not in record and json.loads((tmp_path / PROVENANCE).read_text()) == record
    assert record["command"] == sys.argv
