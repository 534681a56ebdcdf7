"""P-EAGLE (issue 24): trained here from the same store, lossless in our loop, exported in the
speculators layout that vLLM's own config loader maps to PeagleLlamaForCausalLM."""

import json

import pytest
import torch

from specdraft.errors import SpecdraftError
from specdraft.families import family, family_of
from specdraft.formats.checkpoints import export, load_checkpoint, load_drafter
from specdraft.infer.speculative import generate
from specdraft.model.peagle.module import PeagleDrafter
from specdraft.model.peagle.proposer import PeagleProposer
from specdraft.train.loop import train
from test_train import config, ws  # noqa: F401  (the tiny workspace fixture)


@pytest.fixture(scope="module")
def peagle_run(ws, tmp_path_factory):  # noqa: F811
    run = tmp_path_factory.mktemp("peagle") / "run"
    summary = train(config(ws, run, family="peagle", epochs=2, ttt_steps=3))
    return run, summary


def test_peagle_trains_from_the_store_and_round_trips(peagle_run, ws):  # noqa: F811
    run, summary = peagle_run
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first_loss = next(r["metrics"]["loss"] for r in records if r["split"] == "train")
    assert summary["val"]["loss"] < first_loss and "full_acc_2" in summary["val"]
    config_json = json.loads((run / "best" / "config.json").read_text())
    assert config_json["speculators_model_type"] == "peagle"
    mask_id = config_json["mask_token_id"]
    assert isinstance(mask_id, int) and 0 <= mask_id < ws["target"].vocab_size
    tensors, cfg, layout = load_checkpoint(run / "best")
    drafter = load_drafter(run / "best")
    assert isinstance(drafter, PeagleDrafter) and family_of(drafter).model_type == "peagle"
    assert tensors["mask_hidden"].shape == (3 * ws["target"].hidden_size,)
    assert torch.equal(drafter.mask_hidden.detach(), tensors["mask_hidden"])
    assert float(tensors["mask_hidden"].abs().sum()) > 0                       # learned, not the zero vector
    with pytest.raises(SpecdraftError, match="--tree: P-EAGLE drafts a chain"):
        family("peagle").proposer(drafter, tree=object())


@pytest.mark.parametrize("k", [1, 2, 4])
def test_peagle_is_lossless_in_our_loop(peagle_run, ws, k):  # noqa: F811
    run, _ = peagle_run
    drafter, target = load_drafter(run / "best"), ws["target"].model
    offered = 0
    for prompt in ws["samples"][:4]:
        x = torch.tensor([prompt[:10]])
        ref = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=20, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, 10:].tolist()
        out = generate(target, prompt[:10], PeagleProposer(drafter, k=k), max_new_tokens=20, eos_token_ids=set())
        assert out.token_ids == ref
        assert all(p <= k for p in out.proposed)
        offered += sum(out.proposed)
    assert offered > 0


def test_the_peagle_export_is_what_vllm_reads(peagle_run, tmp_path):
    """vLLM's own speculators loader: model type peagle -> PeagleLlamaForCausalLM, mask token -> pard_token."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    run, _ = peagle_run
    export(run, tmp_path / "export", "speculators")
    config_json = json.loads((tmp_path / "export" / "config.json").read_text())
    vllm_config = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(config_json)))
    assert vllm_config["architectures"] == ["PeagleLlamaForCausalLM"]
    assert vllm_config["pard_token"] == config_json["mask_token_id"]
    assert vllm_config["eagle_aux_hidden_state_layer_ids"] == config_json["eagle_aux_hidden_state_layer_ids"]
    assert SpeculatorsConfig.extract_vllm_speculative_config(config_json)["num_speculative_tokens"] >= 1
    with pytest.raises(SpecdraftError, match="no sglang layout"):
        export(run, tmp_path / "sglang", "sglang")


def test_bench_and_generate_take_peagle_by_its_family_name(peagle_run, ws, tmp_path):  # noqa: F811
    from typer.testing import CliRunner

    from specdraft.cli import app

    run, _ = peagle_run
    runner = CliRunner()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "say one two three"}) + "\n")
    out = tmp_path / "bench.json"
    res = runner.invoke(app, ["bench", "--model", ws["model"], "--drafter", str(run), "--prompts", str(prompts),
                              "--methods", "greedy,peagle", "-k", "3", "--max-new-tokens", "12", "--rounds", "1",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["methods"]["peagle"]["identical_to_greedy"] is True
    res = runner.invoke(app, ["bench", "--model", ws["model"], "--drafter", str(run), "--prompts", str(prompts),
                              "--methods", "greedy,eagle3", "-k", "3", "--rounds", "1"])
    assert isinstance(res.exception, SpecdraftError)             # main() turns it into one line, exit 2
    assert "--methods eagle3: the --drafter is a peagle drafter; name it --methods peagle" in str(res.exception)
    res = runner.invoke(app, ["generate", "--model", ws["model"], "--drafter", str(run), "--method", "peagle",
                              "-k", "3", "--prompt", "hello", "--max-new-tokens", "8", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["new_tokens"] > 0


def test_peagle_with_fc_norm_is_refused_before_any_work(ws, tmp_path):  # noqa: F811
    """vLLM's P-EAGLE loader has no fc_norm weights, so such a drafter could never be served."""
    with pytest.raises(SpecdraftError, match="--fc-norm: vLLM serves P-EAGLE without fc_norm"):
        train(config(ws, tmp_path / "run", family="peagle", fc_norm=True))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
