import torch

from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.common.cache import GrowingKVCache
from specdraft.model.eagle3.module import DynamicCache, Eagle3Drafter, causal_mask, ttt_mask
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
    full_logits, full_hidden = model(ids, hidden, pos, causal_mask(torch.zeros(B, T, dtype=torch.long)), DynamicCache())
    cache = GrowingKVCache()                                                  # generation's cache
    outs = []
    for t in range(T):
        logits, _ = model(ids[:, t:t + 1], hidden[:, t:t + 1], pos[:, t:t + 1], None, cache)
        outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), full_logits, atol=1e-5, rtol=1e-5)
    cache.crop(3)
    assert len(cache) == 3


def test_fc_norm_norms_each_aux_chunk_and_round_trips_through_both_layouts(tmp_path):
    """EAGLE-3.1's fc_norm: one RMSNorm per aux layer before fc, so one layer's scale cannot drown
    the others; its tensors (`fc_norm.{i}.weight`, vLLM's names) survive our layout and an export
    without our config block, and the reloaded drafter computes what it computed."""
    import json

    import pytest

    from specdraft.errors import SpecdraftError
    from specdraft.formats.checkpoints import export, load_drafter, save_drafter

    model, target = tiny_drafter(fc_norm=True, norm_output=True)
    t2d = torch.zeros(100, dtype=torch.bool)
    t2d[:40] = True
    model.init_from_target(target, torch.zeros(40, dtype=torch.long), t2d)
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(model.state_dict())
    with torch.no_grad():
        for norm in model.fc_norm:
            norm.weight.uniform_(0.5, 1.5)
    aux = torch.randn(2, 5, 3, 32)
    scaled = aux.clone()
    scaled[:, :, 1] *= 100.0                                  # one aux layer 100x louder: normed away
    torch.testing.assert_close(model.combine_aux(scaled), model.combine_aux(aux), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model.combine_aux(aux.flatten(-2)), model.combine_aux(aux))
    plain, _ = tiny_drafter()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("fc_norm")})
    assert not torch.allclose(plain.combine_aux(scaled), model.combine_aux(scaled), atol=1e-2)

    ids, pos = torch.randint(0, 100, (1, 5)), torch.arange(5)[None]
    mask = causal_mask(torch.zeros(1, 5, dtype=torch.long))

    def run(net):
        logits, hidden = net(ids, net.combine_aux(aux[:1]), pos, mask, DynamicCache())
        return logits, net(ids, hidden, pos + 1, mask, DynamicCache())[0]   # a second step: feedback used

    model.eval()
    save_drafter(model, tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["fc_norm"] is True and config["norm_output"] is True
    for back in (load_drafter(tmp_path / "ours"),):
        for a, b in zip(run(model), run(back)):
            assert torch.equal(a, b)
    # a file another trainer wrote has no "specdraft" block: the top-level keys must carry the options.
    # SGLang reads fc_norm / norm_output from its config.json too (sgl-project/sglang#24663), and the
    # fc_norm tensors under vLLM's (and SGLang's) names
    for layout in ("speculators", "sglang"):
        export(tmp_path / "ours", tmp_path / layout, layout, dtype="float32")
        config = json.loads((tmp_path / layout / "config.json").read_text())
        assert config["fc_norm"] is True and config["norm_output"] is True
        del config["specdraft"]
        (tmp_path / layout / "config.json").write_text(json.dumps(config))
        foreign = load_drafter(tmp_path / layout)
        assert foreign.config.fc_norm and foreign.config.norm_output
        for a, b in zip(run(model), run(foreign)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    config = json.loads((tmp_path / "speculators" / "config.json").read_text())
    config["norm_before_fc"] = True
    (tmp_path / "speculators" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecdraftError, match="norm_before_fc"):
        load_drafter(tmp_path / "speculators")


def test_init_layer_from_target_computes_the_targets_last_layer():
    """With the embedding half of q/k/v at zero, the drafter's layer on hidden h is the target's
    last decoder layer on h: the start `--init-layer target` promises."""
    from types import SimpleNamespace

    from specdraft.targets import last_layer_tensors

    model, target = tiny_drafter()
    model.init_layer_from_target(last_layer_tensors(SimpleNamespace(model=target)))
    H, T = 32, 6
    q = model.layers[0].self_attn.q_proj.weight
    assert torch.equal(q[:, :H], torch.zeros_like(q[:, :H]))
    hidden = torch.randn(1, T, H)
    pos = torch.arange(T)[None]
    ours = model.decode(torch.randint(0, 100, (1, T)), hidden, pos,
                        causal_mask(torch.zeros(1, T, dtype=torch.long)), DynamicCache())
    rotary = target.model.rotary_emb(hidden, pos)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    theirs = target.model.layers[-1](hidden, attention_mask=mask, position_ids=pos, position_embeddings=rotary)
    theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_init_layer_target_reads_the_last_layer_from_the_checkpoint_when_training_holds_only_the_head(tiny_target):
    """Training loads a TargetHead (no layers): `--init-layer target` reads the last layer's tensors
    from the checkpoint files and starts from the same weights as with the whole model loaded."""
    from specdraft.targets import load_target, load_target_head
    from specdraft.train.config import RunConfig
    from specdraft.train.drafters import fresh_drafter
    from specdraft.vocab import Vocab

    head, whole = load_target_head(str(tiny_target)), load_target(str(tiny_target))
    t2d = torch.zeros(whole.vocab_size, dtype=torch.bool)
    t2d[:40] = True
    vocab = Vocab(torch.zeros(40, dtype=torch.long), t2d)
    cfg = RunConfig(init_layer="target")
    a = fresh_drafter(cfg, head, vocab, [2, 4, 5]).state_dict()
    b = fresh_drafter(cfg, whole, vocab, [2, 4, 5]).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    last = whole.model.model.layers[-1]
    assert torch.equal(a["layers.0.mlp.down_proj.weight"], last.mlp.down_proj.weight)
    fresh = fresh_drafter(RunConfig(), head, vocab, [2, 4, 5]).state_dict()
    assert not torch.equal(fresh["layers.0.mlp.down_proj.weight"], a["layers.0.mlp.down_proj.weight"])
