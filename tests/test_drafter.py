import torch

from specdraft.model.config import DrafterConfig
from specdraft.model.drafter import Eagle3Drafter, KVCache, causal_mask, ttt_mask
from specdraft.testing import tiny_llama


def tiny_drafter(seed=0, **kw):
    torch.manual_seed(seed)
    target = tiny_llama(vocab_size=100, hidden_size=32, num_layers=8, num_heads=4, num_kv_heads=2)
    cfg = DrafterConfig.from_target(target.config, draft_vocab_size=40, aux_layer_ids=[2, 4, 5], **kw)
    return Eagle3Drafter(cfg), target


def test_shapes_and_parameter_names():
    model, _ = tiny_drafter()
    H = 32
    names = set(model.state_dict())
    expected = {"embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                "layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight",
                "layers.0.post_attention_layernorm.weight"}
    expected |= {f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"}
    expected |= {f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert expected <= names
    assert model.fc.weight.shape == (H, 3 * H)
    assert model.layers[0].self_attn.q_proj.weight.shape[1] == 2 * H
    assert model.lm_head.weight.shape == (40, H)
    assert not model.embed_tokens.weight.requires_grad


def test_ttt_mask_six_tokens():
    doc = torch.zeros(1, 6, dtype=torch.long)
    m = ttt_mask(doc, 2)[0, 0]
    assert m.shape == (6, 18)
    for i in range(6):
        seen = set(torch.nonzero(m[i]).flatten().tolist())
        assert seen == set(range(i + 1)) | {6 + i, 12 + i}
    # two packed documents never see each other
    doc2 = torch.tensor([[0, 0, 0, 1, 1, 1]])
    m2 = ttt_mask(doc2, 1)[0, 0]
    assert torch.nonzero(m2[4]).flatten().tolist() == [3, 4, 10]


def test_incremental_cache_equals_full_forward():
    model, _ = tiny_drafter()
    model.eval()
    B, T, H = 1, 7, 32
    ids = torch.randint(0, 100, (B, T))
    hidden = torch.randn(B, T, H)
    pos = torch.arange(T)[None]
    full_logits, full_hidden = model(ids, hidden, pos, causal_mask(torch.zeros(B, T, dtype=torch.long)), KVCache())
    cache = KVCache()
    outs = []
    for t in range(T):
        logits, _ = model(ids[:, t:t + 1], hidden[:, t:t + 1], pos[:, t:t + 1], None, cache)
        outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), full_logits, atol=1e-5, rtol=1e-5)
    cache.crop(3)
    assert len(cache) == 3
