import subprocess
import sys

import pytest
import torch

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



def test_shared_kv_attention_is_bit_identical_to_sdpa():
    """A GQA target on CPU runs sdpa_shared_kv (no per-head copy of the cache): the logits of a
    left-padded batch and greedy generation equal transformers' own sdpa exactly, and a verify-style
    forward (several tokens on a cache, under a mask) too."""
    from transformers import DynamicCache

    from specdraft.targets import SHARED_KV_SDPA, share_kv_heads_on_cpu
    from specdraft.testing import tiny_llama

    model = tiny_llama(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=3)
    ids = torch.randint(3, 200, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0
    mask[1, :2] = 0

    def run():
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
            out = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[:1], past_key_values=cache, use_cache=True)
            verify = model(input_ids=ids[1:2, :5], position_ids=torch.arange(12, 17)[None], past_key_values=cache,
                           use_cache=True).logits
        return logits, out, verify

    assert model.config._attn_implementation == "sdpa"
    before = run()
    share_kv_heads_on_cpu(model)
    assert model.config._attn_implementation == SHARED_KV_SDPA
    for a, b in zip(before, run()):
        assert torch.equal(a, b)
