"""The tiny random targets of every architecture users bring (specdraft.testing.TINY_ARCHS): each
saves as an ordinary HF folder, reloads with its Auto class and generates past the sliding window
and the attention chunk, with its decoder layers and final norm where get_decoder() points."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from specdraft.testing import TINY_ARCHS, save_tiny_arch

NUM_LAYERS = 3                                   # sliding/chunked, full, sliding/chunked
HYBRID = {"gpt_oss", "gemma3_text", "gemma3", "llama4"}


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_arch_saves_reloads_and_generates(tmp_path, arch):
    folder = save_tiny_arch(tmp_path / arch, arch, num_layers=NUM_LAYERS)
    config = AutoConfig.from_pretrained(folder)
    auto = AutoModelForImageTextToText if hasattr(config, "text_config") else AutoModelForCausalLM
    model = auto.from_pretrained(folder).eval()

    text = model.config.get_text_config()
    assert text.num_hidden_layers == NUM_LAYERS
    if arch in HYBRID:
        assert len(set(text.layer_types)) == 2, text.layer_types

    decoder = model.get_decoder()
    if arch == "llama4":  # transformers 5.19: Llama4ForConditionalGeneration.get_decoder() is the ForCausalLM
        assert type(decoder).__name__ == "Llama4ForCausalLM"
        decoder = decoder.model
    assert len(decoder.layers) == NUM_LAYERS
    assert decoder.norm is not None

    prompt = torch.randint(7, text.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
    assert out.shape[1] > 40
    assert len(set(out[0, 40:].tolist())) > 1      # the sharpened head gives non-constant greedy text
