"""Shared workspace and checks for the bad-input tests (test_bad_inputs.py and its siblings):
a finished tiny workspace, and `check_refusal`, which asserts exit 2, one stderr line, no traceback,
and existing outputs unchanged."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from specdraft.testing import save_tiny_target

LAYERS = "2,4,5"


def tree_hash(path: Path) -> str:
    """Hash of every file (name + bytes) under `path`: an output left intact hashes the same."""
    h = hashlib.sha256()
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def conv(user: str = "hi", answer: str = "hello there") -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny_target):
    """A finished tiny workspace (data, hidden, vocab, a drafter checkpoint) plus broken variants."""
    from specdraft.data import capture as cap
    from specdraft.data.prepare import prepare
    from specdraft.formats.checkpoints import save_checkpoint
    from specdraft.model.eagle3.config import DrafterConfig
    from specdraft.model.eagle3.module import Eagle3Drafter
    from specdraft.targets import load_target
    from specdraft.train.checkpoint import drafter_tensors
    from specdraft import vocab as vocab_mod
    from rich.console import Console

    root = tmp_path_factory.mktemp("bad")
    good = write_jsonl(root / "good.jsonl", [conv(f"question {i}", f"answer number {i} " * 3) for i in range(10)])
    prepare(model=str(tiny_target), source=str(good), out=root / "data", console=Console(stderr=True, quiet=True))
    cap.capture(model=str(tiny_target), data=root / "data", out=root / "hidden", layers=[2, 4, 5],
                dtype="float32", shard_tokens=200, progress=False)
    vocab_mod.build_from_data(root / "data", 32, root / "vocab.safetensors", model=str(tiny_target))
    target = load_target(str(tiny_target))
    vocab = vocab_mod.load(root / "vocab.safetensors")
    dcfg = DrafterConfig.from_target(target.config, draft_vocab_size=32, aux_layer_ids=[2, 4, 5],
                                     verifier=str(tiny_target))
    drafter = Eagle3Drafter(dcfg)
    drafter.init_from_target(target.model, vocab.d2t, vocab.t2d)
    save_checkpoint(root / "drafter", drafter_tensors(drafter), dcfg)

    # another target: same shapes, other weights (fingerprint differs), and one without a chat template
    other = save_tiny_target(root / "other", seed=1)
    no_template = save_tiny_target(root / "no_template", template="none")
    # a target whose weights are NaN from layer 3 on: its hidden states are NaN
    nan_target = save_tiny_target(root / "nan_target")
    from safetensors.torch import load_file, save_file
    weights = load_file(str(nan_target / "model.safetensors"))
    weights["model.layers.3.mlp.down_proj.weight"].fill_(float("nan"))
    save_file(weights, str(nan_target / "model.safetensors"), metadata={"format": "pt"})
    # its own prepared data: the fingerprint sees every layer, so data of `target` is not its data
    prepare(model=str(nan_target), source=str(good), out=root / "data-nan", console=Console(stderr=True, quiet=True))
    return {"root": root, "target": str(tiny_target), "other": str(other), "no_template": str(no_template),
            "nan_target": str(nan_target)}


def copy(ws, name: str, new: str) -> Path:
    dst = ws["root"] / new
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(ws["root"] / name, dst)
    return dst


def run_cli(monkeypatch, capsys, args) -> tuple[int, str, str]:
    from specdraft import cli

    monkeypatch.setattr(sys, "argv", ["specdraft", *map(str, args)])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.err, captured.out


def check_refusal(ws, monkeypatch, capsys, case_build, phrase, after_start=False):
    args, keep = case_build(ws)
    before = tree_hash(keep) if keep is not None else None
    code, err, out = run_cli(monkeypatch, capsys, args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert code == 2, f"exit {code}, stderr:\n{err}"
    if after_start:   # progress lines first, then the error as the one last line
        assert [line for line in lines if line.startswith("error:")] == lines[-1:], err
    else:
        assert len(lines) == 1, f"expected one stderr line, got:\n{err}"
    assert lines[-1].startswith("error:"), lines[-1]
    assert phrase in lines[-1], f"{phrase!r} not in: {lines[-1]}"
    if keep is not None:
        assert tree_hash(keep) == before, f"{keep} changed"
    return lines[-1]
