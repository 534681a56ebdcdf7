import subprocess
import sys

import pytest

from specdraft.errors import SpecdraftError
from specdraft.targets import check_aux_layers, default_aux_layers, info, load_target


def test_default_aux_layers():
    assert default_aux_layers(30) == [2, 15, 27]
    assert default_aux_layers(8) == [2, 4, 5]


def test_aux_layer_out_of_range():
    with pytest.raises(SpecdraftError, match="out of range"):
        check_aux_layers([2, 4, 8], 8)


def test_info_and_identity(tiny_target):
    d = info(str(tiny_target))
    assert d["num_layers"] == 8 and d["hidden_size"] == 64 and d["chat_template"]
    a = load_target(str(tiny_target))
    b = load_target(str(tiny_target), dtype="bfloat16")
    assert a.identity["fingerprint"] == b.identity["fingerprint"]


def test_cli_bad_model_exits_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdraft.cli", "info", "--model", str(tmp_path / "nope.gguf")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "GGUF file not found" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_identity_and_head_from_the_checkpoint_files(tiny_target, tmp_path):
    """What the vLLM engine path reads without loading the model equals what loading gives."""
    import shutil

    import torch

    from specdraft.targets import describe_target, load_target_head

    full = load_target(str(tiny_target))
    described = describe_target(str(tiny_target))
    assert described.model is None and described.identity == full.identity
    assert described.num_layers == 8 and described.hidden_size == 64 and described.vocab_size == full.vocab_size
    head = load_target_head(str(tiny_target))
    assert head.identity == full.identity
    for get in ("get_input_embeddings", "get_output_embeddings"):
        assert torch.equal(getattr(head.model, get)().weight, getattr(full.model, get)().weight)
    h = torch.randn(5, 64)
    torch.testing.assert_close(head.model.model.norm(h), full.model.model.norm(h))

    broken = tmp_path / "broken"
    shutil.copytree(tiny_target, broken)
    from safetensors.torch import load_file, save_file
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SpecdraftError, match="has no tensor model.norm.weight; use --engine hf"):
        describe_target(str(broken))

