"""Flex-attention path of the TTT attention: same mask, same loss and metrics as SDPA; refused on CPU.

On CPU flex_attention runs eagerly (an unfused reference implementation) and, in torch 2.13, has
no backward ("FlexAttention does not support backward on CPU"), so the forward comparisons run
under no_grad; that is enough to check that the BlockMask path computes what the SDPA path does.
"""

import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.module import Eagle3Drafter, ttt_block_mask, ttt_mask
from specdraft.testing import tiny_llama
from specdraft.model.eagle3.objective import TTTObjective, ttt_forward
from specdraft.train.objective import TeacherHead, finalize_metrics


# two documents and two padding positions in row 0; one document then padding in row 1
DOC_IDS = torch.tensor([[0, 0, 0, 1, 1, -1],
                        [0, 0, 0, 0, -1, -1]])


@pytest.mark.parametrize("step", [0, 1, 2, 3])
def test_block_mask_equals_ttt_mask(step):
    block_mask = ttt_block_mask(DOC_IDS, step)
    B, T = DOC_IDS.shape
    dense = create_mask(block_mask.mask_mod, B, 1, T, (step + 1) * T, device="cpu")   # every (q, kv) pair
    expected = ttt_mask(DOC_IDS, step)
    assert dense.shape == expected.shape == (B, 1, T, (step + 1) * T)
    assert torch.equal(dense, expected)
    assert block_mask.seq_lengths == (T, (step + 1) * T)


def test_block_mask_semantics_by_hand():
    """Independent of ttt_mask: query 4 (doc 1) at step 2 sees keys 3, 4 of step 0 and key 4 of steps 1, 2."""
    dense = create_mask(ttt_block_mask(DOC_IDS, 2).mask_mod, 2, 1, 6, 18, device="cpu")
    assert dense[0, 0, 4].nonzero().flatten().tolist() == [3, 4, 10, 16]
    assert dense[0, 0, 5].nonzero().flatten().tolist() == [5, 11, 17]        # padding sees itself


def tiny_setup(seed=0, B=2, T=12, V=16, H=16):
    torch.manual_seed(seed)
    tgt = tiny_llama(vocab_size=V, hidden_size=H, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=32)
    cfg = DrafterConfig.from_target(tgt.config, draft_vocab_size=V, aux_layer_ids=[1, 2, 3])
    drafter = Eagle3Drafter(cfg)
    teacher = TeacherHead(torch.ones(H), torch.randn(V, H), eps=cfg.rms_norm_eps)
    doc_ids = torch.tensor([[0] * 5 + [1] * 5 + [-1] * 2, [0] * 9 + [-1] * 3])
    pos = torch.zeros_like(doc_ids)
    for b in range(B):
        for t in range(1, T):
            pos[b, t] = pos[b, t - 1] + 1 if doc_ids[b, t] == doc_ids[b, t - 1] else 0
    loss_mask = (doc_ids >= 0).to(torch.uint8)
    loss_mask[0, :2] = 0
    batch = {"input_ids": torch.randint(0, V, (B, T)), "aux": torch.randn(B, T, 3, H),
             "last": torch.randn(B, T, H), "loss_mask": loss_mask, "doc_ids": doc_ids, "position_ids": pos}
    return drafter, teacher, batch


@torch.no_grad()
def test_flex_forward_matches_sdpa_on_cpu():
    drafter, teacher, batch = tiny_setup()
    loss_sdpa, sums_sdpa = ttt_forward(drafter, teacher, batch, steps=3, attention="sdpa")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        loss_flex, sums_flex = ttt_forward(drafter, teacher, batch, steps=3, attention="flex")
    assert loss_sdpa.item() > 0
    assert loss_flex.item() == pytest.approx(loss_sdpa.item(), abs=1e-5)
    m_sdpa, m_flex = finalize_metrics(sums_sdpa), finalize_metrics(sums_flex)
    assert m_sdpa.keys() == m_flex.keys()
    for key in m_sdpa:
        assert m_flex[key] == pytest.approx(m_sdpa[key], abs=1e-5), key


@torch.no_grad()
def test_objective_passes_attention_through():
    drafter, teacher, batch = tiny_setup(seed=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        flex_loss, _ = TTTObjective(drafter, teacher, steps=2, attention="flex").eval()(batch)
    sdpa_loss, _ = TTTObjective(drafter, teacher, steps=2).eval()(batch)
    assert flex_loss.item() == pytest.approx(sdpa_loss.item(), abs=1e-5)
    with pytest.raises(ValueError, match="attention"):
        ttt_forward(drafter, teacher, batch, steps=1, attention="xformers")


MESSAGE = ("--attention flex: needs a CUDA device (flex attention compiles for GPUs); "
           "use --attention sdpa on CPU")


def test_train_cli_refuses_flex_on_cpu(tmp_path):
    """Refused before any input is read (the store and vocab here do not exist)."""
    r = subprocess.run([sys.executable, "-m", "specdraft.cli", "train", "--attention", "flex",
                        "--store", str(tmp_path / "no-store"), "--vocab", str(tmp_path / "no-vocab"),
                        "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"})
    assert r.returncode == 2, r.stderr + r.stdout
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and MESSAGE in lines[0], lines
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


def test_train_module_refuses_flex_on_cpu_and_bad_choice(tmp_path, capsys):
    from specdraft.train.__main__ import main

    common = ["--store", str(tmp_path / "s"), "--vocab", str(tmp_path / "v"), "--out", str(tmp_path / "r")]
    assert main(["--attention", "flex", *common]) == 2
    assert MESSAGE in " ".join(capsys.readouterr().err.split())
    assert main(["--attention", "xformers", *common]) == 2
    assert "--attention xformers: use sdpa or flex" in capsys.readouterr().err


@torch.no_grad()
def test_flex_forward_under_bf16_autocast():
    """precision=auto trains under bf16 autocast: flex must accept the autocast q/k/v dtypes too."""
    drafter, teacher, batch = tiny_setup(seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        loss_sdpa, _ = ttt_forward(drafter, teacher, batch, steps=2, attention="sdpa")
        loss_flex, _ = ttt_forward(drafter, teacher, batch, steps=2, attention="flex")
    assert loss_flex.item() == pytest.approx(loss_sdpa.item(), rel=2e-2)
