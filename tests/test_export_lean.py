"""Lean exports (issue 16 part 5): --weights-dtype (bf16 by default), --no-embeddings checked against the
target, and the README.md model card in every export folder."""

import json
import shutil
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specdraft.errors import SpecdraftError
from specdraft.formats.checkpoints import load_checkpoint, load_drafter, save_checkpoint
from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.module import DynamicCache, Eagle3Drafter, causal_mask
from specdraft.targets import load_target
from specdraft.vocab import mapping_from_counts

AUX = [2, 4, 5]


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_target):
    """A drafter initialised from the tiny target (its embeddings are the target's), saved fp32 in a
    run folder with the files a recipe leaves (config.yaml, metrics.jsonl, bench.json, eval.json)."""
    root = tmp_path_factory.mktemp("lean")
    target = load_target(str(tiny_target))
    cfg = DrafterConfig.from_target(target.config, draft_vocab_size=16, aux_layer_ids=AUX, verifier=str(tiny_target))
    counts = np.random.default_rng(0).integers(0, 100, cfg.vocab_size)
    d2t, t2d = mapping_from_counts(counts, cfg.draft_vocab_size)
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg)
    drafter.init_from_target(target.model, d2t, t2d)
    tensors = {k: v.detach().clone() for k, v in drafter.state_dict().items() if not k.startswith("rotary_emb")}
    run = root / "runs" / "r1"
    save_checkpoint(run / "best", tensors, cfg)
    (run / "best" / "inputs.json").write_text(json.dumps(
        {"target": {"id": str(tiny_target), "fingerprint": target.identity["fingerprint"]}, "layer_ids": AUX,
         "num_samples": 123, "num_tokens": 4567}))
    (run / "config.yaml").write_text("ttt_steps: 3\nepochs: 2\n")
    (run / "metrics.jsonl").write_text(json.dumps({"split": "train", "epoch": 1, "step": 9, "tokens_seen": 9134}) + "\n")
    (run / "bench.json").write_text(json.dumps(
        {"methods": {"greedy": {"tokens_per_s": 10.0, "speedup": 1.0},
                     "eagle3": {"accept_len": 2.345, "tokens_per_s": 19.0, "speedup": 1.9}},
         "config": {"k": 3, "num_prompts": 8, "prompts": "builtin-holdout"}}))
    other = {**tensors, "embed_tokens.weight": tensors["embed_tokens.weight"].clone()}
    other["embed_tokens.weight"][5] += 1.0                           # trained embeddings: not the target's
    save_checkpoint(root / "trained_embed", other, cfg)
    return {"root": root, "run": run, "ckpt": run / "best", "target": str(tiny_target), "model": target.model,
            "cfg": cfg, "tensors": tensors}


def run_main(monkeypatch, capsys, *args):
    """The CLI in-process -> (exit code, stderr lines)."""
    from specdraft.cli import main

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["specdraft", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def config_dtypes(folder):
    c = json.loads((folder / "config.json").read_text())
    layer = c.get("transformer_layer_config", c)
    return {c.get("dtype"), c.get("torch_dtype"), layer.get("dtype"), layer.get("torch_dtype")}


@pytest.mark.parametrize("fmt", ["speculators", "sglang"])
def test_export_is_bf16_by_default_and_config_says_so(made, tmp_path, monkeypatch, capsys, fmt):
    out = tmp_path / "e"
    code, err = run_main(monkeypatch, capsys, "export", made["ckpt"], "--format", fmt, "--out", out)
    assert code == 0, err
    on_disk = load_file(str(out / "model.safetensors"))
    floats = {k: v.dtype for k, v in on_disk.items() if k not in ("d2t", "t2d")}
    assert set(floats.values()) == {torch.bfloat16}
    assert on_disk["d2t"].dtype == torch.int64 and on_disk["t2d"].dtype == torch.bool
    assert config_dtypes(out) == {"bfloat16"}
    back, _, _ = load_checkpoint(out)                                 # our import reads it back
    for k, v in made["tensors"].items():
        assert torch.equal(back[k], v.to(torch.bfloat16) if v.is_floating_point() else v), k


def test_export_float16_and_float32(made, tmp_path, monkeypatch, capsys):
    for dtype, torch_dtype in (("float16", torch.float16), ("float32", torch.float32)):
        out = tmp_path / dtype
        assert run_main(monkeypatch, capsys, "export", made["ckpt"], "--out", out, "--weights-dtype", dtype)[0] == 0
        assert load_file(str(out / "model.safetensors"))["fc.weight"].dtype == torch_dtype
        assert config_dtypes(out) == {dtype}


def draft_logits(drafter):
    g = torch.Generator().manual_seed(1)
    T, H = 5, drafter.config.hidden_size
    aux = torch.randn(1, T, 3 * H, generator=g)
    tokens = torch.randint(0, drafter.config.vocab_size, (1, T), generator=g)
    with torch.no_grad():
        logits, _ = drafter(tokens, drafter.combine_aux(aux), torch.arange(T)[None],
                            causal_mask(torch.zeros(1, T, dtype=torch.long)), DynamicCache())
    return logits


def test_no_embeddings_drops_them_and_loads_with_the_targets(made, tmp_path, monkeypatch, capsys):
    full, lean = tmp_path / "full", tmp_path / "lean"
    assert run_main(monkeypatch, capsys, "export", made["run"], "--out", full, "--weights-dtype", "float32")[0] == 0
    code, err = run_main(monkeypatch, capsys, "export", made["run"], "--out", lean, "--weights-dtype", "float32",
                         "--no-embeddings", "--model", made["target"])
    assert code == 0, err
    assert "embed_tokens.weight" in load_file(str(full / "model.safetensors"))
    assert "embed_tokens.weight" not in load_file(str(lean / "model.safetensors"))
    assert (lean / "model.safetensors").stat().st_size < (full / "model.safetensors").stat().st_size
    with pytest.raises(Exception, match="no embed_tokens"):
        load_drafter(lean)                                            # without the target: named
    a = load_drafter(full)
    b = load_drafter(lean, target_model=made["model"])
    assert torch.equal(b.embed_tokens.weight, made["model"].get_input_embeddings().weight.float())
    assert torch.equal(draft_logits(a), draft_logits(b))
    assert "not included" in (lean / "README.md").read_text()


def test_no_embeddings_refused_when_they_differ_or_without_model(made, tmp_path, monkeypatch, capsys):
    out = tmp_path / "o"
    code, err = run_main(monkeypatch, capsys, "export", made["root"] / "trained_embed", "--out", out,
                         "--no-embeddings", "--model", made["target"])
    assert code == 2 and len(err) == 1 and "differ" in err[0] and "1 rows" in err[0], err
    assert not out.exists()
    code, err = run_main(monkeypatch, capsys, "export", made["ckpt"], "--out", out, "--no-embeddings")
    assert code == 2 and len(err) == 1 and "--model" in err[0], err
    assert not out.exists()


def test_bad_dtype_exits_2_in_one_line(made, tmp_path, monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, "export", made["ckpt"], "--out", tmp_path / "o", "--weights-dtype", "int8")
    assert code == 2 and len(err) == 1 and "--weights-dtype int8" in err[0] and "bfloat16" in err[0], err
    assert not (tmp_path / "o").exists()


def test_model_card_and_re_export_over_it(made, tmp_path, monkeypatch, capsys):
    out = tmp_path / "card"
    assert run_main(monkeypatch, capsys, "export", made["run"], "--out", out)[0] == 0
    text = (out / "README.md").read_text()
    assert f"| target | `{made['target']}` |" in text
    assert str(AUX) in text                                           # aux layer ids
    assert "| draft vocab size | 16 " in text
    assert "| TTT steps | 3 |" in text and "123 samples, 4567 tokens" in text and "9134 tokens trained" in text
    assert ("| τ at K=3 (what it serves) | τ 2.35 at K=3 on 8 builtin hold-out prompts (bench eagle3 (bench.json), "
            "1.90x transformers' greedy) |") in text
    fingerprint = json.loads((made["ckpt"] / "inputs.json").read_text())["target"]["fingerprint"]
    assert fingerprint in text
    spec = json.dumps({"method": "eagle3", "model": str(out.resolve()), "num_speculative_tokens": 3})
    assert f"vllm serve {made['target']} \\\n  --tensor-parallel-size 1 \\\n  --speculative-config '{spec}'" in text
    assert f"vllm serve {out.resolve()}\n" in text                    # speculators' short form: the folder names its target
    assert "--speculative-algorithm EAGLE3" in text
    # a previous export that holds README.md is replaced (sglang layout: the SGLang command is its own)
    code, err = run_main(monkeypatch, capsys, "export", made["run"], "--out", out, "--format", "sglang")
    assert code == 0, err
    assert f"--speculative-draft-model-path {out.resolve()} " in (out / "README.md").read_text()
    # outside a run: what is not known says so
    bare = tmp_path / "bare"
    save_checkpoint(bare, made["tensors"], made["cfg"])
    assert run_main(monkeypatch, capsys, "export", bare, "--out", tmp_path / "bare_out")[0] == 0
    text = (tmp_path / "bare_out" / "README.md").read_text()
    assert "| TTT steps | unknown |" in text and "| training data | unknown |" in text
    assert "| τ at K=3 (what it serves) | unknown |" in text


def test_export_is_recorded_beside_the_export_for_the_runs_report(made, tmp_path, monkeypatch, capsys):
    """EXPORT/export.json names the run it came from, so `specdraft report RUN` finds each export near the run
    (the latest record per folder) and shows the path and the serve commands; the card's commands are the
    report's (serve_commands)."""
    from specdraft.formats import card
    from specdraft.schemas.exports import exports_of

    out = made["run"].parent / "rec"
    for k in (3, 5):                                                 # the same folder twice: one entry, the latest
        shutil.rmtree(out, ignore_errors=True)
        code, err = run_main(monkeypatch, capsys, "export", made["run"], "--out", out, "-k", k)
        assert code == 0, err
    entries = [e for e in exports_of(made["run"]) if e.out == str(out.resolve())]
    assert len(entries) == 1 and entries[0].num_speculative_tokens == 5 and entries[0].layout == "speculators"
    assert json.loads((out / "export.json").read_text())["run"] == str(made["run"].resolve())
    readme = (out / "README.md").read_text()
    for _, _, command in card.serve_commands(made["target"], out.resolve(), 5, "speculators"):
        assert command in readme


def test_an_eagle31_drafter_serves_on_both_engines_and_norm_before_residual_on_vllm_only(tmp_path):
    """Issue 36 item 9: the quick profile's EAGLE-3.1 drafter (fc_norm / norm_output) was refused by
    `export --format sglang` though SGLang reads both since sgl-project/sglang#24663: the card and
    the report give both engines' commands and the SGLang release it needs; a drafter SGLang cannot
    serve (norm_before_residual) gets vLLM's command, the reason, and the export's refusal names the
    retrain flag."""
    from specdraft.analysis.report import served_as
    from specdraft.formats import card
    from specdraft.model.eagle3 import sglang

    from test_formats import tiny_config

    assert sglang.unsupported(tiny_config()) is None and sglang.needs(tiny_config()) is None
    cfg = tiny_config(fc_norm=True, norm_output=True)
    assert sglang.unsupported(cfg) is None
    needs = sglang.needs(cfg)
    assert "fc_norm and norm_output" in needs and "sgl-project/sglang#24663" in needs
    commands = card.serve_commands("tiny/target", tmp_path, 3, "speculators", None, None, needs)
    assert [engine for engine, _, _ in commands] == ["vLLM", "SGLang"]
    assert commands[1][1].startswith("This drafter needs an SGLang with EAGLE-3.1 drafters")
    assert "--format sglang" in commands[1][1] and "--speculative-algorithm EAGLE3" in commands[1][2]
    (tmp_path / "config.json").write_text(json.dumps({"specdraft": {"drafter_config": cfg.to_dict()}}))
    fam, lacks, needed = served_as(str(tmp_path))
    assert (fam.model_type, dict(fam.vllm_speculative), lacks, needed) == ("eagle3", {"method": "eagle3"}, None, needs)
    line = card.engines_line(cfg, "ws/runs/quick", "ws/export/sglang")
    assert line.startswith("vLLM (this export) and SGLang (specdraft export ws/runs/quick --format sglang "
                           "--out ws/export/sglang; needs an SGLang with EAGLE-3.1")

    residual = tiny_config(norm_before_residual=True)
    assert sglang.unsupported(residual) == "norm_before_residual"
    commands = card.serve_commands("tiny/target", tmp_path, 3, "speculators", sglang.unsupported(residual))
    assert [engine for engine, _, _ in commands] == ["vLLM", "SGLang"] and "SGLang cannot serve" in commands[1][1]
    assert commands[1][2] == "" and "SGLang" not in commands[0][1]     # the note under its own heading, no command
    assert card.engines_line(residual, "r", "s") == ("vLLM (this export); not SGLang: it does not implement "
                                                     "norm_before_residual")
    with pytest.raises(SpecdraftError) as refused:
        sglang.build_config(residual, "bfloat16", "ws/runs/a/best")
    assert str(refused.value) == ("ws/runs/a/best: the drafter uses norm_before_residual, which SGLang's "
                                  "LlamaForCausalLMEagle3 does not implement; serve it with vLLM (export --format "
                                  "speculators), or retrain it for SGLang with train's "
                                  "--no-norm-before-residual")
    assert len(card.serve_commands("tiny/target", tmp_path, 3, "speculators")) == 2


def test_the_card_reads_the_runs_records_when_best_has_no_inputs_and_quotes_tau_at_its_k(made, tmp_path):
    """Exporting a run picks best/; runs trained before best/ carried inputs.json gave "training data:
    unknown" and "target fingerprint: unknown". τ is quoted at the K the export serves: eval's τ at
    that K, a bench τ at another K named with its K."""
    from specdraft.formats import card

    run = tmp_path / "run"
    shutil.copytree(made["run"], run)
    (run / "best" / "inputs.json").rename(tmp_path / "inputs.json")
    for n in (1, 2):
        (run / "checkpoints" / f"epoch-{n}").mkdir(parents=True)
    inputs = json.loads((tmp_path / "inputs.json").read_text())
    (run / "checkpoints" / "epoch-2" / "inputs.json").write_text(json.dumps(inputs))
    (run / "eval.json").write_text(json.dumps({"accept_len": 2.9, "k": 5, "split": "val (3 held-out samples)",
                                               "accept_len_by_k": [1.0, 1.6, 2.1, 2.5, 2.7, 2.9]}))
    facts = card.facts(run / "best", made["cfg"])
    assert facts["samples"] == 123 and facts["fingerprint"] == inputs["target"]["fingerprint"]
    text = card.render(facts, made["cfg"], out=tmp_path / "e", layout="speculators", dtype="bfloat16",
                       embeddings=True, speculative_tokens=2, weight_bytes=1000)
    assert "| training data | 123 samples, 4567 tokens" in text
    assert "| τ at K=2 (what it serves) | τ 2.10 at K=2 on held-out store samples (eval, simulated (eval.json)) |" in text
    assert "| 2.35 | 3 | 8 builtin hold-out prompts | bench eagle3 (bench.json) |" in text   # the others, one table


def test_the_card_leads_with_tau_on_natural_prompts_at_the_served_k(made, tmp_path):
    """Issue 36: one headline τ, on the natural prompt set at the K the export serves, every τ named
    with its K and prompts; a served K no measurement ran is said, not hidden."""
    from specdraft.formats import card

    run = tmp_path / "run"
    shutil.copytree(made["run"], run)
    natural = {"methods": {"plain": {"tokens_per_s": 12.0, "speedup": 1.2},
                           "eagle3": {"accept_len": 1.87, "tokens_per_s": 15.0, "speedup": 1.5,
                                      "speedup_over_plain": 1.25}},
               "config": {"k": 3, "num_prompts": 6, "prompts": "natural"}}
    (run / "bench_natural.json").write_text(json.dumps(natural))
    taus = card.tau_measurements(run)
    assert [(t["k"], t["prompts"]) for t in taus[:2]] == [(3, "natural"), (3, "builtin-holdout")]
    assert card.headline_text(taus, 3) == ("τ 1.87 at K=3 on 6 natural prompts (bench eagle3 "
                                           "(bench_natural.json), 1.25x plain decoding in specdraft's loop)")
    assert card.headline_text(taus, 2).endswith("; served at K=2, which no measurement here ran")
    text = card.render(card.facts(run / "best", made["cfg"]), made["cfg"], out=tmp_path / "e", layout="speculators",
                       dtype="bfloat16", embeddings=True, speculative_tokens=3, weight_bytes=1000)
    assert "| τ at K=3 (what it serves) | τ 1.87 at K=3 on 6 natural prompts" in text
    assert "| 2.35 | 3 | 8 builtin hold-out prompts | bench eagle3 (bench.json) |" in text


def test_an_export_serves_the_drafters_own_k_not_a_machines(made, tmp_path, monkeypatch, capsys):
    """Issue 56: the export's num_speculative_tokens is the drafter's own, the draft positions its run trained
    (ttt_steps), unless -k asks; never a bench's -k auto choice for the CPU that ran it. Outside a run: 3."""
    run = tmp_path / "run"
    shutil.copytree(made["run"], run)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("ttt_steps: 3", "ttt_steps: 5") if "ttt_steps: 3" in config.read_text()
                      else config.read_text() + "ttt_steps: 5\n")
    bench = json.loads((run / "bench.json").read_text())
    (run / "bench.json").write_text(json.dumps({**bench, "config": {**bench.get("config", {}), "k": 1}}))
    for source, want in ((run, 5), (made["ckpt"], 3)):
        out = tmp_path / f"out-{want}"
        code, err = run_main(monkeypatch, capsys, "export", source, "--out", out)
        assert code == 0, err
        assert json.loads((out / "config.json").read_text())["speculators_config"]["proposal_methods"][0][
            "speculative_tokens"] == want
    assert json.loads((tmp_path / "out-5" / "export.json").read_text())["num_speculative_tokens"] == 5


def test_the_embedded_defaults_verifier_is_the_gguf_it_was_trained_against(tmp_path, monkeypatch):
    """Issue 56: a drafter of the embedded default names the hub id as its verifier, but was trained on the
    Q4_1 GGUF dequantized into the cache: the speculators config gets that folder's architectures (was []),
    and the card says what the drafter was trained against and which folder to serve for it."""
    from specdraft.formats import card
    from specdraft.formats.checkpoints import verifier_architectures
    from specdraft.targets import DEFAULT_FOLDER, DEFAULT_HUB_ID

    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path))
    assert verifier_architectures(DEFAULT_HUB_ID) == [] and card.trained_against(DEFAULT_HUB_ID) is None
    folder = tmp_path / DEFAULT_FOLDER
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (folder / "specdraft-source.json").write_text(json.dumps({"gguf": "/x/SmolLM2-135M-Instruct.Q4_1.gguf",
                                                              "hub_id": DEFAULT_HUB_ID}))
    assert verifier_architectures(DEFAULT_HUB_ID) == ["LlamaForCausalLM"]
    line = card.trained_against(DEFAULT_HUB_ID)
    assert "`SmolLM2-135M-Instruct.Q4_1.gguf` (a GGUF) dequantized into" in line and str(folder) in line
    assert card.trained_against("org/other") is None and verifier_architectures("org/other") == []
