"""Every architecture users bring (testing.TINY_ARCHS: Llama, Qwen3, Qwen3-MoE, DeepSeek-V3, the Kimi-K2.5
wrapper, gpt-oss, Gemma 3 text and its 4B+ wrapper, Qwen2.5-VL, Llama 4), as a tiny random config built
offline: the verify loop equals transformers' own generate on it with prompts longer than its sliding
window or attention chunk, the TargetHead is its logits, the fingerprint read from the checkpoint is the
loaded model's, and the README's pipeline runs through every stage (docs/targets.md is that table)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arch_pipeline import BEGIN, END, STAGES, doc_table, pipeline_result, support_table
from specdraft.testing import TINY_ARCHS

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from specdraft.testing import save_tiny_arch

    folders = {}

    def get(arch: str) -> Path:
        if arch not in folders:
            folders[arch] = save_tiny_arch(tmp_path_factory.mktemp(arch) / "target", arch)
        return folders[arch]
    return get


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_verify_loop_equals_transformers_generate(arch, saved):
    """Plain decoding, an eagle3 chain and an eagle3 tree through our loop give transformers' own greedy
    tokens: 40 prompt + 24 new tokens against a sliding window / attention chunk of 8 (gpt-oss's eager
    attention took the bool mask as +1/+0 scores, and windows were never slid)."""
    from specdraft.adapter import default_aux_layers
    from specdraft.infer.speculative import generate
    from specdraft.infer.tree import TreeShape
    from specdraft.model.eagle3 import EagleProposer
    from specdraft.targets import load_target
    from specdraft.testing import tiny_drafter_for

    target = load_target(str(saved(arch)))
    torch.manual_seed(1)
    prompt = torch.randint(4, 250, (40,)).tolist()
    want = target.model.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24,
                                 do_sample=False)[0, 40:].tolist()
    drafter = tiny_drafter_for(target.model, default_aux_layers(target.num_layers))
    assert generate(target.model, prompt, None, max_new_tokens=24, eos_token_ids=set()).token_ids == want
    chain = generate(target.model, prompt, EagleProposer(drafter, k=3), max_new_tokens=24, eos_token_ids=set())
    assert chain.token_ids == want
    tree = EagleProposer(drafter, k=3, tree=TreeShape.parse("2,2,2"))
    assert generate(target.model, prompt, tree, max_new_tokens=24, eos_token_ids=set()).token_ids == want


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_target_head_is_the_models_logits_and_the_fingerprint_its_checkpoints(arch, saved):
    """What training loads (TargetHead: embeddings, the target's own final norm module, lm_head, read from
    the checkpoint under the names transformers' conversion mapping finds) gives the model's logits;
    rms_norm with adapter.final_norm's weight (the teachers' math) too, Gemma's x·(1+w) included."""
    import torch.nn.functional as F

    from specdraft.adapter import final_norm
    from specdraft.targets import load_target, load_target_head, tap_hidden_states

    folder = str(saved(arch))
    target, head = load_target(folder), load_target_head(folder)
    assert head.identity["fingerprint"] == target.identity["fingerprint"]
    ids = torch.randint(4, 250, (1, 30))
    got = {}
    with torch.no_grad(), tap_hidden_states(target.model, [], lambda slot, h: None, lambda h: got.update(last=h)):
        logits = target.model(ids).logits
    torch.testing.assert_close(head.model.logits(got["last"]), logits, rtol=1e-5, atol=1e-5)
    weight, eps = final_norm(head.model)
    teacher = F.linear(F.rms_norm(got["last"], weight.shape, weight, eps), head.model.get_output_embeddings().weight)
    torch.testing.assert_close(teacher, logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_the_readme_pipeline_runs_on_every_architecture(arch):
    """info, prepare (its chat template), capture, vocab, train, eval, bench (eagle3 = greedy) and both
    exports, as the README writes them, scaled down."""
    result = pipeline_result(arch)
    assert {s: result.get(s) for s in STAGES} == dict.fromkeys(STAGES, "ok"), result
    assert result["bench identical"], result


def test_docs_targets_md_is_the_tests_table():
    """docs/targets.md's table is what these tests give (scripts/targets_table.py writes it)."""
    doc = (ROOT / "docs/targets.md").read_text()
    assert BEGIN in doc and END in doc
    assert doc_table(doc) == support_table({arch: pipeline_result(arch) for arch in TINY_ARCHS})


def test_info_says_what_the_target_is_and_an_aux_default_fits_any_depth(saved):
    from specdraft.adapter import default_aux_layers
    from specdraft.targets import check_aux_layers, info

    for depth in range(3, 40):
        ids = default_aux_layers(depth)
        assert check_aux_layers(ids, depth) == ids and len(ids) == 3
    assert default_aux_layers(32) == [2, 16, 29]           # vLLM's default where it is distinct
    kimi = info(str(saved("kimi_k25")))
    assert kimi["architecture"] == "Kimi_K25ForConditionalGeneration"
    assert "deepseek_v3" in kimi["model_type"] and "MLA" in kimi["attention"] and kimi["mlp"].startswith("MoE")
    assert kimi["drafter_shape"]["head_dim"] == 16          # v_head_dim, not the 8-wide rope part
    assert kimi["init_layer_target"].startswith("no")
    gpt = info(str(saved("gpt_oss")))
    assert "sliding" in gpt["attention"] and "window 8" in gpt["attention"] and gpt["thinking"].startswith("harmony (this architecture")


def test_the_drafter_shape_is_a_setting_recorded_in_the_run_and_init_layer_target_says_why_not():
    """A big target's drafter is shaped by --draft-heads/--draft-kv-heads/--draft-head-dim/--draft-intermediate
    (the run's config.yaml keeps them, the export's layer config has them); a target whose layers are MLA or
    MoE refuses --init-layer target in one line, and a bad head split is refused before anything is written."""
    import json

    import yaml

    from arch_pipeline import invoke

    work = Path(pipeline_result("kimi_k25")["work"])
    train = ["train", "--model", str(work / "target"), "--store", "ws/hidden", "--vocab", "ws/vocab.safetensors",
             "--epochs", "1", "--max-tokens", "128", "--precision", "fp32", "--val-fraction", "0.25"]
    code, text = invoke(train + ["--out", "ws/runs/shaped", "--draft-heads", "2", "--draft-kv-heads", "1",
                                 "--draft-head-dim", "32", "--draft-intermediate", "96"], work)
    assert code == 0, text
    layer = json.loads((work / "ws/runs/shaped/best/config.json").read_text())["transformer_layer_config"]
    assert (layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"],
            layer["intermediate_size"]) == (2, 1, 32, 96)
    recorded = yaml.safe_load((work / "ws/runs/shaped/config.yaml").read_text())
    assert (recorded["draft_heads"], recorded["draft_head_dim"], recorded["draft_intermediate"]) == (2, 32, 96)
    code, text = invoke(train + ["--out", "ws/runs/bad", "--draft-heads", "3", "--draft-kv-heads", "2"], work)
    assert code == 2 and "--draft-kv-heads 2: must divide the drafter's 3 attention heads" in text
    assert not (work / "ws/runs/bad").exists()
    code, text = invoke(train + ["--out", "ws/runs/copy", "--init-layer", "target"], work)
    assert code == 2 and "multi-head latent attention (MLA)" in text and "--init-layer fresh" in text
    assert not (work / "ws/runs/copy").exists()
    dense = Path(pipeline_result("qwen3")["work"])
    code, text = invoke(["train", "--model", str(dense / "target"), "--store", "ws/hidden", "--vocab",
                         "ws/vocab.safetensors", "--epochs", "1", "--max-tokens", "128", "--precision", "fp32",
                         "--out", "ws/runs/copy", "--init-layer", "target"], dense)
    assert code == 0, text


def test_the_mission_replayed_a_k2_drafter_adapted_to_a_k25_target():
    """The seeds' story at their architecture: a drafter trained on a K2-like target (DeepSeek-V3 text model)
    is fine-tuned on a K2.5-like one (the Kimi-K2.5 vision-language wrapper around it, other weights, a draft
    vocabulary of another size and order): the lm_head rows are remapped (remap.json counts the overlap and the
    positional matches), and `compare` puts it beside the same training from scratch with a verdict."""
    import json

    from arch_pipeline import invoke

    k2 = Path(pipeline_result("deepseek_v3")["work"]) / "ws/runs/a/best"
    k25 = Path(pipeline_result("kimi_k25")["work"])
    code, text = invoke(["vocab", "build", "--prepared", "ws/data", "--size", "48", "--out", "ws/vocab48.safetensors"], k25)
    assert code == 0, text
    train = ["train", "--model", str(k25 / "target"), "--store", "ws/hidden", "--vocab", "ws/vocab48.safetensors",
             "--epochs", "2", "--max-tokens", "128", "--precision", "fp32", "--val-fraction", "0.25",
             "--warmup-steps", "1", "--lr", "3e-3"]
    assert invoke(train + ["--out", "ws/runs/k25-scratch"], k25)[0] == 0
    code, text = invoke(train + ["--out", "ws/runs/k25-from-k2", "--from-pretrained", str(k2)], k25)
    assert code == 0, text
    remap = json.loads((k25 / "ws/runs/k25-from-k2/remap.json").read_text())
    assert remap["remapped"] and remap["draft_vocab_size"] == 48 and remap["positional_matches"] < 48
    code, text = invoke(["compare", "ws/runs/k25-scratch", "ws/runs/k25-from-k2", "--baseline", "ws/runs/k25-scratch",
                         "--json"], k25)
    assert code == 0, text
    table = json.loads(text[text.index("{"):])
    assert table["runs"] == ["k25-scratch", "k25-from-k2"]
    verdict = table["watch"]["k25-from-k2"]                  # the seeds' question (fine-tuned vs scratch), answered
    assert isinstance(verdict, str) and verdict and not verdict.startswith("no verdict")


def test_moe_weight_floor_counts_the_experts_a_token_reads(saved):
    """-k auto and plan price a verify from the weight floor: an MoE target streams only the share of its
    routed experts a token routes to (Kimi-K2.5: 8 of 384), never all of them."""
    from specdraft.adapter import active_fraction, is_expert_weight
    from specdraft.bandwidth import streamed_weight_bytes
    from specdraft.targets import load_target

    for arch in ("qwen3_moe", "deepseek_v3", "gpt_oss"):
        model = load_target(str(saved(arch))).model
        params = dict(model.named_parameters())
        experts = sum(p.numel() * p.element_size() for n, p in params.items() if is_expert_weight(n))
        assert experts > 0 and active_fraction(model.config) == 0.5           # 2 of 4 experts per token
        embed = model.get_input_embeddings().weight
        whole = sum(p.numel() * p.element_size() for p in params.values() if p is not embed)
        assert streamed_weight_bytes(model) == int(whole - experts * 0.5)


def test_a_quantized_checkpoint_transformers_cannot_run_is_one_line(tmp_path):
    import json

    from specdraft.testing import save_tiny_target

    folder = save_tiny_target(tmp_path / "int4")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
                                     "config_groups": {"g": {"targets": ["Linear"], "weights": {
                                         "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                         "group_size": 32}}}}
    (folder / "config.json").write_text(json.dumps(config))
    from arch_pipeline import invoke

    code, text = invoke(["generate", "--model", str(folder), "--method", "greedy", "--prompt", "hi"], tmp_path)
    assert code == 2 and "compressed-tensors-quantized" in text and "--engine vllm" in text, text
    code, text = invoke(["info", "--model", str(folder)], tmp_path)
    assert code == 0 and "compressed-tensors" in text


def test_end_of_turn_tokens_come_from_the_adapter():
    """gpt-oss's harmony ends an answer at <|return|> (or <|call|>); its <|end|> closes the analysis message
    inside the answer, so it is no end of turn there, while other targets keep the usual markers."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from specdraft.adapter import ARCHITECTURES
    from specdraft.data.render import end_of_turn_ids

    specials = ["<|end|>", "<|return|>", "<|call|>", "<|im_end|>", "a"]
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials)},
                                                                               unk_token="a")), eos_token="<|return|>")
    harmony = end_of_turn_ids(tok, None, ARCHITECTURES["gpt_oss"].end_tokens)
    assert harmony == [1, 2]                                    # <|return|>, <|call|>; not <|end|> (0)
    assert end_of_turn_ids(tok, None, ARCHITECTURES["qwen3"].end_tokens) == [0, 1, 3]


def test_kimi_k25_in_its_published_layout_loads_and_is_read_without_loading(saved, tmp_path):
    """The published Kimi-K2.5 checkpoint keeps its text model under `language_model.model.layers.N` (transformers
    5.19 saves a tiny one as `...blocks.N`): both name the same target, read through the conversion mapping."""
    import shutil

    from safetensors.torch import load_file, save_file

    from specdraft.targets import describe_target, load_target, load_target_head

    folder = tmp_path / "k25"
    shutil.copytree(saved("kimi_k25"), folder)
    tensors = load_file(folder / "model.safetensors")
    published = {k.replace("language_model.model.blocks.", "language_model.model.layers."): v for k, v in tensors.items()}
    assert any(k.startswith("language_model.model.layers.") for k in published)
    save_file(published, folder / "model.safetensors", metadata={"format": "pt"})
    loaded, described = load_target(str(folder)), describe_target(str(folder))
    original = load_target(str(saved("kimi_k25")))
    assert described.identity["fingerprint"] == loaded.identity["fingerprint"] == original.identity["fingerprint"]
    head = load_target_head(str(folder))
    torch.testing.assert_close(head.model.lm_head.weight, original.model.get_output_embeddings().weight)


def test_a_vllm_config_error_names_its_cause():
    """vLLM refuses a model it cannot inspect (e.g. a vision-language class without torchvision) with a pydantic
    error whose first line says nothing; the one line we print carries the cause."""
    from specdraft.data.vllm_engine import first_line

    error = ValueError("1 validation error for ModelConfig\n  Value error, Model architectures ['Llama4ForConditional"
                       "Generation'] failed to be inspected. Please check the logs for more details. [type=value_error, "
                       "input_value=ArgsKwargs((), {'model': ...})]\n    For further information visit https://x")
    assert first_line(error) == ("1 validation error for ModelConfig: Model architectures ['Llama4ForConditional"
                                 "Generation'] failed to be inspected. Please check the logs for more details.")
    assert first_line(RuntimeError("plain\nmore")) == "plain"
