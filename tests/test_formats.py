"""Drafter checkpoints: speculators / SGLang / official EAGLE-3 layouts, export and import."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.errors import SpecdraftError
from specdraft.formats.checkpoints import export, import_checkpoint, load_checkpoint, resolve_checkpoint, save_checkpoint
from specdraft.model.eagle3.tensors import expected_shapes
from specdraft.model.eagle3.config import DrafterConfig
from specdraft.vocab import mapping_from_counts


def tiny_config(**kw):
    base = dict(hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                vocab_size=50, draft_vocab_size=10, aux_layer_ids=[2, 4, 5], target_num_layers=8,
                verifier="tiny/target", rope_theta=50000.0)
    base.update(kw)
    return DrafterConfig(**base)


def tiny_tensors(cfg, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    tensors = {k: torch.randn(s, generator=g).to(dtype) for k, s in expected_shapes(cfg).items()
               if k not in ("d2t", "t2d")}
    counts = np.random.default_rng(seed).integers(0, 100, cfg.vocab_size)
    tensors["d2t"], tensors["t2d"] = mapping_from_counts(counts, cfg.draft_vocab_size)
    return tensors


def assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("layout", ["speculators", "sglang"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_tensor_exact(tmp_path, layout, dtype):
    cfg, tensors = tiny_config(), tiny_tensors(tiny_config(), dtype=dtype)
    save_checkpoint(tmp_path / "ckpt", tensors, cfg, layout=layout)
    back, cfg2, detected = load_checkpoint(tmp_path / "ckpt")
    assert detected == layout and cfg2 == cfg
    assert_same(tensors, back)
    from specdraft import vocab
    assert torch.equal(vocab.load(tmp_path / "ckpt").d2t, tensors["d2t"])   # a drafter folder is a mapping too
    on_disk = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    prefix = "layers.0." if layout == "speculators" else "midlayer."
    assert f"{prefix}hidden_norm.weight" in on_disk and "fc.weight" in on_disk and "d2t" in on_disk


def test_speculators_config_has_what_vllm_reads(tmp_path):
    cfg = tiny_config()
    save_checkpoint(tmp_path / "c", tiny_tensors(cfg), cfg, speculative_tokens=4)
    c = json.loads((tmp_path / "c" / "config.json").read_text())
    assert c["speculators_model_type"] == "eagle3" and c["architectures"] == ["Eagle3Speculator"]
    sc = c["speculators_config"]
    assert sc["algorithm"] == "eagle3" and sc["default_proposal_method"] == "greedy"
    assert sc["proposal_methods"][0] == {"proposal_type": "greedy", "speculative_tokens": 4, "verifier_accept_k": 1}
    assert sc["verifier"]["name_or_path"] == "tiny/target"
    tl = c["transformer_layer_config"]
    assert tl["model_type"] == "llama" and tl["num_hidden_layers"] == 1 and tl["vocab_size"] == 50
    assert tl["rope_theta"] == 50000.0 and tl["head_dim"] == 4
    # vLLM defaults norm_before_residual to True when absent: it must be written
    assert c["norm_before_residual"] is False and c["draft_vocab_size"] == 10
    assert c["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]


def test_plain_speculators_config_without_our_block(tmp_path):
    """A checkpoint written by speculators itself has no "specdraft" block."""
    cfg = tiny_config(norm_before_residual=True)
    save_checkpoint(tmp_path / "c", tiny_tensors(cfg), cfg)
    path = tmp_path / "c" / "config.json"
    c = json.loads(path.read_text())
    del c["specdraft"]
    path.write_text(json.dumps(c))
    _, cfg2, _ = load_checkpoint(tmp_path / "c")
    assert cfg2 == tiny_config(norm_before_residual=True, target_num_layers=0)


def sglang_config(cfg):
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads, "num_hidden_layers": 1, "vocab_size": cfg.vocab_size,
            "draft_vocab_size": cfg.draft_vocab_size, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
            "max_position_embeddings": 4096, "hidden_act": "silu", "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}}


def midlayer_names(tensors):
    return {k.replace("layers.0.", "midlayer."): v for k, v in tensors.items()}


def test_import_hand_built_sglang_checkpoint(tmp_path):
    cfg = tiny_config()
    tensors = tiny_tensors(cfg)
    del tensors["embed_tokens.weight"]            # SGLang/EAGLE drafters usually share the target's
    folder = tmp_path / "sgl"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(sglang_config(cfg)))
    save_file(midlayer_names(tensors), str(folder / "model.safetensors"))
    back, cfg2, layout = load_checkpoint(folder)
    assert layout == "sglang"
    assert_same(tensors, back)
    assert cfg2.aux_layer_ids == [2, 4, 5]        # SGLang's "output of layer i" ids + 1
    assert (cfg2.hidden_size, cfg2.head_dim, cfg2.rope_theta) == (16, 4, 50000.0)
    summary = import_checkpoint(folder, tmp_path / "ours")
    assert summary["source_layout"] == "sglang" and not summary["has_embed_tokens"]
    again, _, layout = load_checkpoint(tmp_path / "ours")
    assert layout == "speculators"
    assert_same(tensors, again)


def test_official_eagle_bin_layout(tmp_path):
    cfg = tiny_config()
    tensors = tiny_tensors(cfg)
    del tensors["embed_tokens.weight"], tensors["t2d"]   # t2d is rebuilt from d2t
    folder = tmp_path / "eagle"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(sglang_config(cfg)))
    torch.save(midlayer_names(tensors), folder / "pytorch_model.bin")
    back, _, layout = load_checkpoint(folder)
    assert layout == "eagle"
    assert torch.equal(back["d2t"], tensors["d2t"]) and int(back["t2d"].sum()) == cfg.draft_vocab_size
    assert torch.equal(back["layers.0.hidden_norm.weight"], tensors["layers.0.hidden_norm.weight"])


def test_bin_with_code_is_refused(tmp_path):
    cfg = tiny_config()
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(sglang_config(cfg)))
    torch.save({"fc.weight": torch.zeros(1), "x": object()}, folder / "pytorch_model.bin")
    with pytest.raises(SpecdraftError, match="weights-only"):
        load_checkpoint(folder)


def test_absolute_d2t_rejected_on_export_and_import(tmp_path):
    cfg = tiny_config()
    tensors = tiny_tensors(cfg)
    tensors["d2t"] = torch.arange(cfg.draft_vocab_size) + tensors["d2t"]   # absolute ids
    with pytest.raises(SpecdraftError, match=r"absolute target ids.*target_id = draft_id \+ d2t"):
        save_checkpoint(tmp_path / "x", tensors, cfg)
    assert not (tmp_path / "x").exists()
    folder = tmp_path / "sgl"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(sglang_config(cfg)))
    save_file(midlayer_names(tensors), str(folder / "model.safetensors"))
    with pytest.raises(SpecdraftError, match="d2t must hold offsets"):
        load_checkpoint(folder)


def test_shape_mismatch_names_the_tensor(tmp_path):
    cfg = tiny_config()
    tensors = tiny_tensors(cfg)
    tensors["fc.weight"] = torch.zeros(16, 32)
    with pytest.raises(SpecdraftError, match=r"fc.weight has shape \[16, 32\].*\[16, 48\]"):
        save_checkpoint(tmp_path / "x", tensors, cfg)
    tensors = tiny_tensors(cfg)
    tensors["lm_head.weight"] = torch.zeros(12, 16)
    with pytest.raises(SpecdraftError, match="lm_head.weight"):
        save_checkpoint(tmp_path / "x", tensors, cfg)
    tensors = tiny_tensors(cfg)
    del tensors["layers.0.hidden_norm.weight"]
    with pytest.raises(SpecdraftError, match="missing tensor.*hidden_norm"):
        save_checkpoint(tmp_path / "x", tensors, cfg)


def test_config_errors_are_named(tmp_path):
    cfg = tiny_config(aux_layer_ids=[2, 4, 9])
    with pytest.raises(SpecdraftError, match=r"aux layer id\(s\) \[9\] outside the verifier's 8 layers"):
        save_checkpoint(tmp_path / "x", tiny_tensors(cfg), cfg)
    cfg = tiny_config(norm_before_residual=True)
    with pytest.raises(SpecdraftError, match="norm_before_residual.*--format speculators"):
        save_checkpoint(tmp_path / "x", tiny_tensors(cfg), cfg, layout="sglang")
    cfg = tiny_config()
    save_checkpoint(tmp_path / "c", tiny_tensors(cfg), cfg)
    c = json.loads((tmp_path / "c" / "config.json").read_text())
    del c["specdraft"], c["transformer_layer_config"]["intermediate_size"]
    (tmp_path / "c" / "config.json").write_text(json.dumps(c))
    with pytest.raises(SpecdraftError, match="missing config key.*intermediate_size"):
        load_checkpoint(tmp_path / "c")


def test_unknown_layout_lists_what_was_looked_for(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    with pytest.raises(SpecdraftError, match="unknown checkpoint layout.*speculators_model_type.*LlamaForCausalLMEagle3"):
        load_checkpoint(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecdraftError, match="no config.json"):
        load_checkpoint(tmp_path / "empty")


def test_failed_write_leaves_existing_checkpoint_intact(tmp_path):
    cfg = tiny_config()
    old = tiny_tensors(cfg, seed=1)
    save_checkpoint(tmp_path / "c", old, cfg)

    def boom(path):
        raise OSError("disk full")

    with pytest.raises(OSError):
        save_checkpoint(tmp_path / "c", tiny_tensors(cfg, seed=2), cfg, extra_files={"optimizer.pt": boom})
    back, _, _ = load_checkpoint(tmp_path / "c")
    assert_same(old, back)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]     # no temp folders left behind
    save_checkpoint(tmp_path / "c", old, cfg, extra_files={"optimizer.pt": lambda p: torch.save({}, p)})
    assert (tmp_path / "c" / "optimizer.pt").exists()
    (tmp_path / "notckpt").mkdir()
    (tmp_path / "notckpt" / "notes.txt").write_text("mine")
    with pytest.raises(SpecdraftError, match="not empty and not a checkpoint"):
        save_checkpoint(tmp_path / "notckpt", old, cfg)


def test_resolve_run_folder_prefers_best_then_newest_epoch(tmp_path):
    cfg = tiny_config()
    run = tmp_path / "runs" / "r1"
    for name in ("checkpoints/epoch-2", "checkpoints/epoch-10"):
        save_checkpoint(run / name, tiny_tensors(cfg), cfg)
    assert resolve_checkpoint(run) == run / "checkpoints" / "epoch-10"
    save_checkpoint(run / "best", tiny_tensors(cfg), cfg)
    assert resolve_checkpoint(run) == run / "best"
    with pytest.raises(SpecdraftError, match="no checkpoint found"):
        resolve_checkpoint(tmp_path / "runs")


def test_cli_export_and_import(tmp_path, monkeypatch, capsys):
    cfg = tiny_config()
    tensors = tiny_tensors(cfg)
    run = tmp_path / "runs" / "r1"
    save_checkpoint(run / "checkpoints" / "epoch-1", tensors, cfg)
    out = tmp_path / "sgl"
    cmd = [sys.executable, "-m", "specdraft.cli"]
    p = subprocess.run(cmd + ["export", str(run), "--format", "sglang", "--out", str(out), "--json", "--weights-dtype", "float32"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["source"].endswith("epoch-1")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert run_main(monkeypatch, "import", out, "--out", tmp_path / "back") == 0
    back, cfg2, layout = load_checkpoint(tmp_path / "back")
    assert layout == "speculators" and cfg2 == cfg
    assert_same(tensors, back)
    capsys.readouterr()
    assert run_main(monkeypatch, "export", tmp_path / "nothing", "--format", "speculators", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not found" in err[0]


def run_main(monkeypatch, *args):
    """The CLI entry point in-process (one torch import for the whole file); returns the exit code."""
    from specdraft.cli import main

    monkeypatch.setattr(sys, "argv", ["specdraft", *map(str, args)])
    try:
        main()
    except SystemExit as e:
        return e.code or 0
    return 0


def test_export_refuses_unknown_format(tmp_path):
    cfg = tiny_config()
    save_checkpoint(tmp_path / "c", tiny_tensors(cfg), cfg)
    with pytest.raises(SpecdraftError, match="--format gguf"):
        export(tmp_path / "c", tmp_path / "o", "gguf")


def test_verifier_architectures_are_read_only_as_a_list_of_names(tmp_path):
    """A verifier config.json whose `architectures` is a string is not split into characters."""
    from specdraft.formats.checkpoints import verifier_architectures

    (tmp_path / "config.json").write_text(json.dumps({"architectures": "LlamaForCausalLM"}))
    assert verifier_architectures(str(tmp_path)) == []
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert verifier_architectures(str(tmp_path)) == ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(["not", "an", "object"]))
    assert verifier_architectures(str(tmp_path)) == []
