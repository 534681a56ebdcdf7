"""DFlash (issue 24): a block drafter trained here from the same store, lossless in our loop, exported
in the speculators layout that vLLM's own config loader maps to DFlashDraftModel."""

import json

import pytest
import torch

from specdraft.data.store import HiddenStore
from specdraft.errors import SpecdraftError
from specdraft.families import family, family_of
from specdraft.formats.checkpoints import export, load_checkpoint, load_drafter
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import generate
from specdraft.model.dflash.module import DFlashDrafter
from specdraft.model.dflash.objective import block_mask, dflash_forward, pick_anchors
from specdraft.model.dflash.proposer import DFlashProposer
from specdraft.train.loop import train
from specdraft.train.objective import TeacherHead, finalize_metrics
from test_train import config, ws  # noqa: F401  (the tiny workspace fixture)


@pytest.fixture(scope="module")
def dflash_run(ws, tmp_path_factory):  # noqa: F811
    run = tmp_path_factory.mktemp("dflash") / "run"
    summary = train(config(ws, run, family="dflash", epochs=2, ttt_steps=3))
    return run, summary


def test_dflash_trains_from_the_store_and_round_trips(dflash_run, ws):  # noqa: F811
    run, summary = dflash_run
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first_loss = next(r["metrics"]["loss"] for r in records if r["split"] == "train")
    assert summary["val"]["loss"] < first_loss and "full_acc_2" in summary["val"]
    config_json = json.loads((run / "best" / "config.json").read_text())
    assert config_json["speculators_model_type"] == "dflash"
    assert config_json["aux_hidden_state_layer_ids"] == list(HiddenStore(ws["root"] / "hidden").layer_ids)
    assert config_json["block_size"] == 4 and config_json["sample_from_anchor"] is False
    tensors, cfg, _ = load_checkpoint(run / "best")
    drafter = load_drafter(run / "best")
    assert isinstance(drafter, DFlashDrafter) and family_of(drafter).model_type == "dflash"
    assert tensors["layers.0.self_attn.q_norm.weight"].shape == (cfg.head_dim,)
    assert tensors["fc.weight"].shape == (cfg.hidden_size, cfg.num_aux * cfg.hidden_size)
    with pytest.raises(SpecdraftError, match="--tree: DFlash drafts a chain"):
        family("dflash").proposer(drafter, tree=object())


def test_the_block_mask_sees_the_context_before_the_anchor_and_its_own_block():
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, -1]])
    anchors = torch.tensor([[2, 5, -1]])
    mask = block_mask(doc_ids, anchors, 2)[0, 0]                                   # [6, 8 + 6]
    assert mask[0, :8].tolist() == [True, True, False, False, False, False, False, False]
    assert mask[1, :8].tolist() == mask[0, :8].tolist()                            # the mask slot: same context
    assert mask[2, :8].tolist() == [False] * 4 + [True, False, False, False]       # doc 1, before position 5
    assert mask[0, 8:].tolist() == [True, True, False, False, False, False]        # its own block, both ways
    assert mask[4, :8].sum() == 0 and mask[4, 8:].tolist() == [False] * 4 + [True, True]   # padding block
    first_trained = torch.tensor([[False, True, True, True, False, True, True, False]])
    picked = pick_anchors(doc_ids, first_trained, torch.Generator().manual_seed(0))
    assert set(picked[picked >= 0].tolist()) <= {1, 2, 3, 5, 6} and picked.shape[1] == 4


def test_training_metrics_match_the_loop_acceptance_in_spirit(dflash_run, ws):  # noqa: F811
    """The block forward's slot-k predictions are what the proposer drafts: same context, same block."""
    run, _ = dflash_run
    drafter = load_drafter(run / "best")
    target = ws["target"].model
    prompt = ws["samples"][0][:12]
    with torch.no_grad():
        hs = target(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    ids = list(drafter.config.aux_layer_ids)
    aux = torch.stack([hs[i][0] for i in ids], dim=1)                              # [T, n_aux, H]
    proposer = DFlashProposer(drafter, k=3)
    proposer.observe(aux[:8])
    logits = proposer.block_logits(prompt[:9], 3)                                  # root = token 8
    batch = {"input_ids": torch.tensor([prompt]), "aux": aux[None], "doc_ids": torch.zeros(1, 12, dtype=torch.long),
             "position_ids": torch.arange(12)[None]}
    kv = drafter.context_kv(batch["aux"], batch["position_ids"])
    tokens = torch.tensor([[prompt[8]] + [drafter.config.mask_token_id] * 3])
    mask = block_mask(batch["doc_ids"], torch.tensor([[8]]), 4)
    out = drafter.decode(tokens, torch.arange(8, 12)[None], kv, mask)
    torch.testing.assert_close(drafter.compute_logits(out)[0, 1:], logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", [1, 3])   # up to the block's 3 draft slots; -k 5 is refused (test_nothing_lost_4)
def test_dflash_is_lossless_in_our_loop(dflash_run, ws, k):  # noqa: F811
    run, _ = dflash_run
    drafter, target = load_drafter(run / "best"), ws["target"].model
    offered = 0
    for prompt in ws["samples"][:4]:
        x = torch.tensor([prompt[:10]])
        ref = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=20, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, 10:].tolist()
        out = generate(target, prompt[:10], DFlashProposer(drafter, k=k), max_new_tokens=20, eos_token_ids=set())
        assert out.token_ids == ref
        assert all(p <= k for p in out.proposed)
        offered += sum(out.proposed)
    assert offered > 0


def test_dflash_sampling_keeps_the_target_distribution_shape(dflash_run, ws):  # noqa: F811
    """Sampled drafts carry their slot distributions (q over target ids) for the rejection rule."""
    run, _ = dflash_run
    drafter = load_drafter(run / "best")
    proposer = DFlashProposer(drafter, k=3)
    prompt = ws["samples"][1][:10]
    out = generate(ws["target"].model, prompt, proposer, max_new_tokens=16, eos_token_ids=set(),
                   sampling=Sampling(temperature=0.8, seed=3))
    assert len(out.token_ids) == 16 and sum(out.proposed) > 0


def test_the_dflash_export_is_what_vllm_reads(dflash_run, tmp_path):
    """vLLM's own speculators loader: model type dflash -> DFlashDraftModel with our aux ids, mask token
    and a non-causal block; vLLM's target_layer_ids are our ids minus one."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    run, _ = dflash_run
    export(run, tmp_path / "export", "speculators", speculative_tokens=3)
    config_json = json.loads((tmp_path / "export" / "config.json").read_text())
    vllm_config = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(config_json)))
    assert vllm_config["architectures"] == ["DFlashDraftModel"]
    ids = config_json["aux_hidden_state_layer_ids"]
    assert vllm_config["eagle_aux_hidden_state_layer_ids"] == ids
    assert vllm_config["dflash_config"] == {"mask_token_id": config_json["mask_token_id"],
                                            "target_layer_ids": [i - 1 for i in ids],
                                            "sample_from_anchor": False, "causal": False}
    assert vllm_config["model_type"] == "qwen3" and vllm_config["num_hidden_layers"] == 1
    assert SpeculatorsConfig.extract_vllm_speculative_config(config_json) == {"method": "dflash",
                                                                                "num_speculative_tokens": 3}
    with pytest.raises(SpecdraftError, match="trained to draft 3 tokens per round"):
        export(run, tmp_path / "too-long", "speculators", speculative_tokens=5)
    tensors, cfg, _ = load_checkpoint(tmp_path / "export")
    assert cfg.model_type == "dflash" and "layers.0.self_attn.k_norm.weight" in tensors


def test_eagle_only_options_are_refused_before_any_work(ws, tmp_path):  # noqa: F811
    with pytest.raises(SpecdraftError, match="--fc-norm True: an EAGLE-3 option"):
        train(config(ws, tmp_path / "run", family="dflash", fc_norm=True))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_block_forward_gives_every_step_metric(ws):  # noqa: F811
    """Untrained, on one packed row of two documents: sums for each slot, finite loss, gradient flows."""
    target = ws["target"]
    cfg = family("dflash").new_config(target.config, target.config.vocab_size, [1, 2])
    drafter = DFlashDrafter(cfg)
    T, H = 24, cfg.hidden_size
    batch = {"input_ids": torch.randint(0, cfg.vocab_size, (1, T)), "aux": torch.randn(1, T, 2, H),
             "last": torch.randn(1, T, H), "loss_mask": torch.ones(1, T, dtype=torch.long),
             "doc_ids": torch.tensor([[0] * 10 + [1] * 14]), "position_ids": torch.cat([torch.arange(10),
                                                                                        torch.arange(14)])[None]}
    teacher = TeacherHead(torch.ones(H), torch.randn(cfg.draft_vocab_size, H), 1e-6)
    loss, sums = dflash_forward(drafter, teacher, batch, slots=3)
    loss.backward()
    assert torch.isfinite(loss) and drafter.fc.weight.grad.abs().sum() > 0
    metrics = finalize_metrics(sums)
    assert {"loss_0", "loss_2", "cond_acc_2", "accept_len"} <= set(metrics)


def test_the_card_serves_each_family_with_its_vllm_method(dflash_run, tmp_path):
    """DFlash is vLLM's method dflash (P-EAGLE: eagle3 with parallel_drafting); the card and the report say so."""
    from specdraft.analysis.report import served_as

    run, _ = dflash_run
    export(run, tmp_path / "export", "speculators", speculative_tokens=3)
    card_text = (tmp_path / "export" / "README.md").read_text()
    assert '"method": "dflash"' in card_text and "SGLang cannot serve" in card_text
    assert dict(served_as(str(tmp_path / "export"))[0].vllm_speculative) == {"method": "dflash"}
    assert card_text.startswith("# DFlash drafter for ")                  # the family's title, not EAGLE-3's
    assert dict(family("peagle").vllm_speculative) == {"method": "eagle3", "parallel_drafting": True}


def test_a_two_layer_dflash_trains_exports_and_stays_lossless(ws, tmp_path):  # noqa: F811
    """--draft-layers stacks DFlash's layers (vLLM's num_hidden_layers); EAGLE-3 refuses it."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    run = tmp_path / "run"
    train(config(ws, run, family="dflash", epochs=1, ttt_steps=2, draft_layers=2))
    drafter = load_drafter(run / "best")
    assert len(drafter.layers) == 2
    export(run, tmp_path / "export", "speculators")              # no -k: the 2 drafts it was trained for
    config_json = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config_json["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    assert SpeculatorsConfig.extract_transformers_pre_trained_config(config_json)["num_hidden_layers"] == 2
    assert "layers.1.self_attn.q_norm.weight" in load_checkpoint(tmp_path / "export")[0]
    target = ws["target"].model
    prompt = ws["samples"][2][:10]
    x = torch.tensor([prompt])
    ref = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, 10:].tolist()
    assert generate(target, prompt, DFlashProposer(drafter, k=2), max_new_tokens=16, eos_token_ids=set()).token_ids == ref
    with pytest.raises(SpecdraftError, match="--draft-layers 2: an eagle3 drafter has one decoder layer"):
        train(config(ws, tmp_path / "eagle", draft_layers=2))
