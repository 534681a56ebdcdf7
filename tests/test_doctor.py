"""`specdraft doctor`: each cause planted in a tiny run built here is listed first; a healthy run
reports none of them; the JSON schema; one-line errors for missing inputs.

The workspace is real and small: prompts rendered with the tiny target's template and answered by
its own greedy decoding (so the store's assistant tokens are the target's own), captured, a vocab
from them, and a drafter trained on it (a few seconds). Each test copies the run and plants one fault.
"""

from __future__ import annotations

import json
import re
import shlex
import random
import shutil

import pytest
import torch

from specdraft.analysis import doctor
from specdraft.errors import SpecdraftError

WORDS = "the cat sat on a mat and ran to see its friend who was at home".split()
DIGITS = "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) # % $".split()
FEW_SAMPLES = 12     # the overfit plant's store: 3 samples to train on (val_fraction 0.75), 9 held out


def conversations(words, n, seed):
    rnd = random.Random(seed)
    return [[{"role": "user", "content": " ".join(rnd.choice(words) for _ in range(6))}] for _ in range(n)]


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny_target):
    """root/{data, hidden, vocab.safetensors, run (TTT 3, 16 epochs)}, prompts files of both domains, and
    the runs three plants need: ttt1 (TTT 1), lowlr (lr 1000x too small, --baseline run) and few
    (data-few/hidden-few: the first 12 samples, 3 of them trained on for 30 epochs)."""
    from specdraft import vocab
    from specdraft.data.capture import capture
    from specdraft.data.prepared import load_prepared, save_prepared
    from specdraft.data.render import end_of_turn_ids
    from specdraft.templates import template_sha256
    from specdraft.infer.bench import hf_greedy
    from specdraft.infer.prompts import prompt_ids
    from specdraft.targets import load_target
    from specdraft.train.config import RunConfig
    from specdraft.train.loop import train

    root = tmp_path_factory.mktemp("doctor")
    target = load_target(str(tiny_target))
    tok, ends = target.tokenizer, set(end_of_turn_ids(target.tokenizer))
    rows = {"input_ids": [], "loss_mask": [], "messages": []}
    with torch.no_grad():
        for conv in conversations(WORDS, 40, seed=0):
            prompt = prompt_ids(tok, conv)
            answer = hf_greedy(target.model, prompt, 40, ends).token_ids
            rows["input_ids"].append(prompt + answer)
            rows["loss_mask"].append([0] * len(prompt) + [1] * len(answer))
            rows["messages"].append(json.dumps(conv + [{"role": "assistant", "content": tok.decode(answer)}]))
    save_prepared(root / "data", rows, {"target": target.identity, "chat_template_sha256": template_sha256(tok)})
    capture(model=str(tiny_target), data=root / "data", out=root / "hidden", dtype="float32", progress=False)
    vocab.build_from_data(root / "data", 96, root / "vocab.safetensors", model=str(tiny_target))
    few = load_prepared(root / "data")[0].select(range(FEW_SAMPLES))
    save_prepared(root / "data-few", {c: list(few[c]) for c in rows}, load_prepared(root / "data")[1])
    capture(model=str(tiny_target), data=root / "data-few", out=root / "hidden-few", dtype="float32", progress=False)
    runs = {"run": {},                                               # healthy: every other plant starts from it
            "ttt1": {"ttt_steps": 1, "epochs": 8},                   # depth_decay: one trained draft position
            "lowlr": {"lr": 3e-6, "epochs": 2, "baseline": str(root / "run")},          # below_baseline
            "few": {"store": str(root / "hidden-few"), "val_fraction": 0.75, "epochs": 30, "lr": 1e-2}}  # overfit
    for name, changes in runs.items():
        settings = dict(out=str(root / name), store=str(root / "hidden"), vocab=str(root / "vocab.safetensors"),
                        model=str(tiny_target), max_tokens=512, epochs=16, lr=3e-3, warmup_steps=2, log_every=1,
                        val_every=5, val_fraction=0.25, progress=False, precision="fp32", ttt_steps=3)
        train(RunConfig(**{**settings, **changes}))
    for name, words, seed in (("same.jsonl", WORDS, 7), ("other.jsonl", DIGITS, 8)):
        (root / name).write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations(words, 8, seed)))
    return root


def copy_run(ws, tmp_path, name="run"):
    run = tmp_path / name
    shutil.copytree(ws / name, run)
    return run


def ids(result):
    """The causes' ids, in order; every `specdraft ...` command a fix gives must parse with the real CLI
    (its options exist and its required ones are there), so the fix can be pasted."""
    for cause in result["causes"]:
        for command in re.findall(r"specdraft (.+?)(?: \(|;|, then |$)", cause["fix"]):
            assert_parses(command, cause)
    return [c["id"] for c in result["causes"]]


def assert_parses(command: str, cause):
    """Parse `command` (without `specdraft`) as the CLI would, without running it."""
    import typer

    from specdraft.cli import app

    cmd, args = typer.main.get_command(app), shlex.split(command)
    while hasattr(cmd, "commands"):                      # a group: `vocab build`, or specdraft itself
        name, args = args[0], args[1:]
        assert name in cmd.commands, f"{cause['id']}: fix names no command {name!r}: {command}"
        cmd = cmd.commands[name]
    try:
        cmd.make_context(name, args).close()
    except Exception as e:                                # typer's own click: its UsageError
        if not any(k.__name__ == "UsageError" for k in type(e).__mro__):
            raise
        raise AssertionError(f"{cause['id']}: fix {command!r} does not parse: {e}") from None


def test_healthy_run_reports_no_cause_and_the_json_schema(ws, tmp_path):
    result = doctor.diagnose(copy_run(ws, tmp_path), prompts=str(ws / "same.jsonl"))
    assert result["causes"] == [], doctor.format_result(result)
    checked = {c["id"] for c in result["checked"]}
    assert {"vocab_coverage", "vocab_mapping", "aux_layers", "template", "prompt_shift", "undertrained",
            "overfit", "depth_decay"} <= checked
    assert checked | {s["id"] for s in result["skipped"]} == set(doctor.CHECKS)
    saved = json.loads((tmp_path / "run" / doctor.REPORT_FILE).read_text())
    assert saved == json.loads(json.dumps(result)) and set(saved) >= {"causes", "checked"}


def test_report_shows_the_doctor_under_the_headline(ws, tmp_path):
    from specdraft.analysis import report

    run = copy_run(ws, tmp_path)
    doctor.diagnose(run, prompts=str(ws / "other.jsonl"))
    page = report.build([run]).read_text()
    assert page.index("specdraft doctor") < page.index("<h2>Run ")
    assert "prompt_shift" in page and "checked and fine: vocab_coverage" in page


def test_json_schema_of_a_cause_from_the_cli(ws, tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    run = copy_run(ws, tmp_path)
    res = CliRunner().invoke(app, ["doctor", str(run), "--prompts", str(ws / "other.jsonl"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) >= {"causes", "checked"} and out["causes"]
    for cause in out["causes"]:
        assert set(cause) >= {"id", "evidence", "estimated_tau_loss", "fix"}
        assert cause["id"] in doctor.CHECKS and isinstance(cause["evidence"], dict) and cause["fix"]
        assert cause["estimated_tau_loss"] is None or isinstance(cause["estimated_tau_loss"], float)
    assert all(set(c) == {"id", "evidence"} for c in out["checked"])
    # --out: the diagnosis goes where it says, and the run keeps its own RUN/doctor.json as it was
    before = (run / doctor.REPORT_FILE).read_text()
    res = CliRunner().invoke(app, ["doctor", str(run), "--prompts", str(ws / "same.jsonl"), "--out",
                                   str(tmp_path / "d.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "d.json").read_text())["causes"] == [] and (run / doctor.REPORT_FILE).read_text() == before
    res = CliRunner().invoke(app, ["doctor", str(run), "--out", str(run / "eval.json")])   # another command's result
    assert res.exit_code != 0 and "eval.json: is `specdraft eval`'s result" in str(res.exception)


def test_prompt_shift_prompts_from_another_domain(ws, tmp_path):
    result = doctor.diagnose(copy_run(ws, tmp_path), prompts=str(ws / "other.jsonl"))
    assert ids(result)[0] == "prompt_shift", doctor.format_result(result)
    ev = result["causes"][0]["evidence"]
    assert ev["tau_store_held_out"] - ev["tau_prompts"] > doctor.TAU_GAP
    assert f"--conversations {ws / 'other.jsonl'} --regenerate" in result["causes"][0]["fix"]   # the user's own prompts


def test_prompt_shift_never_suggests_training_on_the_natural_set(ws, tmp_path, monkeypatch):
    """The natural set stands for prompts nobody tuned to: the fix names prompts like the served ones, not it."""
    monkeypatch.setattr(doctor, "TAU_GAP", -100.0)                  # the cause holds whatever the tiny τ
    result = doctor.diagnose(copy_run(ws, tmp_path), prompts="natural")
    fix = next(c["fix"] for c in result["causes"] if c["id"] == "prompt_shift")
    assert "--conversations natural" not in fix and "--conversations SOURCE" in fix and "never the natural set" in fix


def test_vocab_coverage_a_draft_vocab_too_small(ws, tmp_path):
    """The run's drafter and vocab cut to the 12 most frequent target tokens (lm_head rows kept)."""
    from safetensors.torch import load_file, save_file

    from specdraft import vocab

    run = copy_run(ws, tmp_path)
    full = vocab.load(ws / "vocab.safetensors")
    counts = torch.tensor(vocab.count_tokens(*[torch.tensor(sum(c, [])).numpy() for c in
                                               (json_rows(ws, "input_ids"), json_rows(ws, "loss_mask"))],
                                             full.target_vocab_size))
    keep_targets = sorted(int(t) for t in counts.argsort(descending=True)[:12] if full.t2d[t])
    rows = [int((full.draft_to_target == t).nonzero()) for t in keep_targets]
    d2t = torch.tensor(keep_targets) - torch.arange(len(rows))
    small = vocab.Vocab(d2t, vocab.t2d_from_d2t(d2t, full.target_vocab_size), full.meta)
    vocab.save(small, run / "small.safetensors")
    tensors = load_file(run / "best" / "model.safetensors")
    tensors.update({"lm_head.weight": tensors["lm_head.weight"][rows].contiguous(), "d2t": small.d2t,
                    "t2d": small.t2d})
    save_file(tensors, run / "best" / "model.safetensors")
    edit_config(run / "best", draft_vocab_size=len(rows))
    set_config(run, vocab=str(run / "small.safetensors"))
    result = doctor.diagnose(run)
    assert ids(result)[0] == "vocab_coverage", doctor.format_result(result)
    assert result["causes"][0]["evidence"]["missing_share"] > doctor.COVERAGE_MAX_MISSING


def test_vocab_mapping_a_shuffled_d2t(ws, tmp_path):
    from safetensors.torch import load_file, save_file

    run = copy_run(ws, tmp_path)
    tensors = load_file(run / "best" / "model.safetensors")
    targets = torch.arange(tensors["d2t"].numel()) + tensors["d2t"]
    shuffled = targets[torch.randperm(targets.numel(), generator=torch.Generator().manual_seed(0))]
    tensors["d2t"] = shuffled - torch.arange(targets.numel())
    save_file(tensors, run / "best" / "model.safetensors")
    result = doctor.diagnose(run)
    assert ids(result)[0] == "vocab_mapping", doctor.format_result(result)
    cause = result["causes"][0]
    assert cause["estimated_tau_loss"] > doctor.TAU_GAP and "disagree" in cause["evidence"]["convention"]


def test_a_scrambled_d2t_leads_even_unestimated_and_behind_an_export(ws, tmp_path):
    """Issue 36: a scrambled d2t planted in a copy of the demo run (its vocab file not at hand, so no
    τ loss could be estimated) came second, under export_mismatch (estimated loss 0.0), whose fix
    would have shipped the broken mapping. A mapping that makes every draft wrong leads."""
    from safetensors.torch import load_file, save_file

    from specdraft.formats.checkpoints import export

    run = copy_run(ws, tmp_path)
    export(run, tmp_path / "export", "speculators", speculative_tokens=3)          # the good mapping, shipped
    tensors = load_file(run / "best" / "model.safetensors")
    targets = torch.arange(tensors["d2t"].numel()) + tensors["d2t"]
    shuffled = targets[torch.randperm(targets.numel(), generator=torch.Generator().manual_seed(0))]
    tensors["d2t"] = shuffled - torch.arange(targets.numel())                      # sizes intact
    save_file(tensors, run / "best" / "model.safetensors")
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text("\n".join(line for line in config.splitlines() if not line.startswith("vocab:")))
    result = doctor.diagnose(run, only=["vocab_mapping", "export_mismatch"])
    assert ids(result) == ["vocab_mapping", "export_mismatch"], doctor.format_result(result)
    assert result["causes"][0]["estimated_tau_loss"] is None and "disagree" in result["causes"][0]["summary"]


def test_overfit_is_the_plain_documented_rule(tmp_path):
    """Issue 36: train acc_0 0.754 vs val 0.485 (gap 0.27, threshold 0.15) was suppressed because the
    run trains on prompts and val still rose, and the report called overfit "checked and fine" above
    curves showing the gap. The documented rule decides; the two facts are said beside it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("train_on_prompts: true\nepochs: 3\n")
    records = [{"split": "train", "epoch": e, "step": e + 1, "tokens_seen": 100 * (e + 1),
                "metrics": {"full_acc_0": 0.754, "loss_0": 1.0, "accept_len": 2.6}} for e in range(3)]
    records += [{"split": "val", "epoch": e, "step": e + 1, "tokens_seen": 100 * (e + 1),
                 "metrics": {"full_acc_0": acc, "loss_0": loss, "accept_len": 1.7}}
                for e, (acc, loss) in enumerate([(0.40, 3.0), (0.45, 2.8), (0.485, 2.7)])]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    finding = doctor.check_overfit(doctor.Doctor(run))
    assert finding.holds and finding.evidence["gap"] == pytest.approx(0.269)
    assert "train_on_prompts" in finding.summary and "still rising" in finding.summary
    assert finding.estimated_tau_loss is None                       # part of the gap is prompt tokens


def test_aux_layers_wrong_ids_in_the_checkpoint_config(ws, tmp_path):
    run = copy_run(ws, tmp_path)
    edit_config(run / "best", aux_layer_ids=[1, 3, 6])
    result = doctor.diagnose(run)
    assert ids(result)[0] == "aux_layers", doctor.format_result(result)
    assert result["causes"][0]["evidence"]["checkpoint_config"] == [1, 3, 6]


def test_template_the_target_serves_another_template(ws, tmp_path, tiny_target):
    from specdraft.testing import tiny_tokenizer

    served = tmp_path / "served"
    shutil.copytree(tiny_target, served)
    tiny_tokenizer("chatml-system").save_pretrained(served)       # same weights, a default system prompt
    result = doctor.diagnose(copy_run(ws, tmp_path), model=str(served))
    assert ids(result)[0] == "template", doctor.format_result(result)
    assert result["causes"][0]["evidence"]["prompts_changed"] > 0


def test_undertrained_the_run_stopped_at_half_its_epochs(ws, tmp_path):
    """The same run as it stood after epoch 4 of 16: its checkpoint and its metrics up to there."""
    run = copy_run(ws, tmp_path)
    shutil.rmtree(run / "best")
    shutil.copytree(run / "checkpoints" / "epoch-4", run / "best")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records if r["epoch"] < 4))
    result = doctor.diagnose(run)
    assert ids(result)[0] == "undertrained", doctor.format_result(result)


def test_depth_decay_a_run_trained_on_one_draft_position(ws, tmp_path):
    """TTT 1: the drafter never saw its own hidden state as input, and the second draft position,
    the first that reads it, drops far below the first."""
    result = doctor.diagnose(copy_run(ws, tmp_path, "ttt1"))
    assert ids(result)[0] == "depth_decay", doctor.format_result(result)
    cause = result["causes"][0]
    ev = cause["evidence"]
    assert ev["trained_positions"] == 1 and len(ev["cond_acc"]) == 3
    assert ev["drop"] > doctor.DEPTH_DROP and ev["first_untrained"] == ev["cond_acc"][1]
    assert cause["estimated_tau_loss"] > 0 and "--ttt-steps 3" in cause["fix"]


def test_overfit_three_samples_for_thirty_epochs(ws, tmp_path):
    result = doctor.diagnose(copy_run(ws, tmp_path, "few"))
    assert ids(result)[0] == "overfit", doctor.format_result(result)
    cause = result["causes"][0]
    ev = cause["evidence"]
    assert ev["gap"] > doctor.OVERFIT_GAP and ev["train_acc_0"] - ev["val_acc_0"] == pytest.approx(ev["gap"], abs=1e-3)
    assert cause["estimated_tau_loss"] > 0 and "--epochs" in cause["fix"]


def test_below_baseline_a_run_with_a_far_too_small_lr(ws, tmp_path):
    """lr 3e-6 against the healthy run (lr 3e-3) as its --baseline: behind at equal tokens_seen."""
    result = doctor.diagnose(copy_run(ws, tmp_path, "lowlr"))
    assert ids(result)[0] == "below_baseline", doctor.format_result(result)
    cause = result["causes"][0]
    ev = cause["evidence"]
    assert ev["run_value"] < ev["baseline_value"] - ev["margin"] and ev["baseline"] == str(ws / "run")
    assert ev["baseline_val_tau"] - ev["val_tau"] == pytest.approx(cause["estimated_tau_loss"], abs=1e-3)
    assert ev["settings_that_differ"] == {"lr": [3e-6, 3e-3]} and "--lr 0.003" in cause["fix"]


def test_export_mismatch_top_level_fields_vllm_reads(ws, tmp_path):
    """config.json's top-level fields changed, its "specdraft" block left as trained: vLLM serves the
    top level. In the run's own checkpoint (a norm flag) and in an export (the aux layer ids)."""
    from specdraft.formats.checkpoints import export

    run = copy_run(ws, tmp_path)
    edit_top_level(run / "best", norm_before_residual=True)
    result = doctor.diagnose(run)
    assert ids(result)[0] == "export_mismatch", doctor.format_result(result)
    cause = result["causes"][0]
    assert cause["evidence"]["differences"] == {str(run / "best"): {"norm_before_residual": [False, True]}}
    assert cause["estimated_tau_loss"] is not None and "specdraft export" in cause["fix"]

    run = copy_run(ws, tmp_path / "second")                  # a fresh copy: its checkpoint as trained
    export(run, tmp_path / "export", "speculators", speculative_tokens=3)
    edit_top_level(tmp_path / "export", eagle_aux_hidden_state_layer_ids=[1, 3, 6])
    result = doctor.diagnose(run)
    assert ids(result)[0] == "export_mismatch", doctor.format_result(result)
    differences = result["causes"][0]["evidence"]["differences"]
    assert list(differences) == [str(tmp_path / "export")]
    assert differences[str(tmp_path / "export")]["aux_layer_ids"][1] == [1, 3, 6]


def test_served_config_for_every_family(tiny_target):
    """Each registered family's config.json as export writes it is served as trained, and moving the
    field its own reader takes the aux layer ids from (whatever the family calls it) is a difference."""
    from transformers import AutoConfig

    from specdraft import families

    target_config = AutoConfig.from_pretrained(tiny_target)
    for name in families.names():
        fam = families.family(name)
        cfg = fam.new_config(target_config, 96, [1, 4, 6], str(tiny_target), None)
        config = json.loads(json.dumps(fam.checkpoint_config(cfg, "float32", 3, ["LlamaForCausalLM"])))
        assert doctor.served_differences(cfg, doctor.served_config(config, name)) == {}, name
        key = doctor.aux_ids_key(config, name)
        assert key in config and config[key] == [1, 4, 6], (name, key)
        moved = doctor.served_config({**config, key: [2, 4, 6]}, name)
        assert doctor.served_differences(cfg, moved) == {"aux_layer_ids": [[1, 4, 6], [2, 4, 6]]}, name


def test_export_mismatch_and_round_cost(ws, tmp_path):
    from specdraft.formats.checkpoints import export

    run = copy_run(ws, tmp_path)
    export(run, tmp_path / "export", "speculators", speculative_tokens=3)
    edit_config(tmp_path / "export", aux_layer_ids=[1, 3, 6])
    result = doctor.diagnose(run)
    assert ids(result)[0] == "export_mismatch", doctor.format_result(result)
    assert "aux_layer_ids" in json.dumps(result["causes"][0]["evidence"])
    # round cost: the export serves K=7, and the measured verify cost grows steeply with the tokens verified
    export(run, tmp_path / "export7", "speculators", speculative_tokens=7)
    (run / "plan.json").write_text(json.dumps({"verify_ms": [10, 25, 40, 55, 70, 85, 100, 115], "draft_ms": 4}))
    result = doctor.diagnose(run, only=["round_cost"])
    assert ids(result) == ["round_cost"], doctor.format_result(result)
    assert result["causes"][0]["evidence"]["best_k"] < 7


def test_missing_inputs_are_one_line_errors(ws, tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    with pytest.raises(SpecdraftError, match="not found"):
        doctor.diagnose(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecdraftError, match="not a run folder"):
        doctor.diagnose(tmp_path / "empty")
    run = copy_run(ws, tmp_path)
    with pytest.raises(SpecdraftError, match="--store"):
        doctor.diagnose(run, store=tmp_path / "no-store")
    with pytest.raises(SpecdraftError, match="--prompts"):
        doctor.diagnose(run, prompts=str(tmp_path / "no.jsonl"))
    res = CliRunner().invoke(app, ["doctor", str(tmp_path / "nothing")])
    assert isinstance(res.exception, SpecdraftError) and "\n" not in str(res.exception)


def json_rows(ws, column):
    from specdraft.data.prepared import load_prepared

    ds, _ = load_prepared(ws / "data")
    return [list(r) for r in ds[column]]


def set_config(run, **fields):
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg.update(fields)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))


def edit_top_level(folder, **fields):
    """Change only the top-level fields of a drafter's config.json (what vLLM reads), as a hand edit or
    another tool would, leaving specdraft's own block as the run trained."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(fields)
    path.write_text(json.dumps(cfg))


def edit_config(folder, **fields):
    """Change a drafter's config.json as another tool would: the top-level fields vLLM reads and
    specdraft's own block alike."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for name, value in fields.items():
        cfg["eagle_aux_hidden_state_layer_ids" if name == "aux_layer_ids" else name] = value
        cfg["specdraft"]["drafter_config"][name] = value
    path.write_text(json.dumps(cfg))


def test_demo_runs_the_doctor_as_a_logged_timed_stage_against_the_ceiling_of_its_k(ws, tmp_path, tiny_target):
    """Issue 36: the demo ran the doctor on τ 1.47 at K=1, where τ can never reach 2.0, for ~95 s
    without a line, and neither recipe.log nor stages.json recorded it. τ is judged against the
    ceiling of the K bench measured it at (K+1), and the doctor runs as a stage."""
    from specdraft import pipeline

    def bench(tau, k):
        return {"methods": {"eagle3": {"accept_len": tau}},
                "config": {"k": k, "prompts": "builtin-holdout", "num_prompts": 6}}

    run = copy_run(ws, tmp_path)
    log = tmp_path / "recipe.log"
    assert pipeline.low_tau_threshold(3) == 2.0 and pipeline.low_tau_threshold(1) < 1.5
    assert pipeline.diagnose_low_tau(str(tiny_target), ws, run, bench(2.5, 3), log) is None
    assert pipeline.diagnose_low_tau(str(tiny_target), ws, run, bench(1.47, 1), log) is None   # good for K=1
    assert not log.exists()
    line = pipeline.diagnose_low_tau(str(tiny_target), ws, run, bench(1.5, 3), log)
    saved = json.loads((run / doctor.REPORT_FILE).read_text())
    assert line == (doctor.top_cause_line(saved) or line) and line.startswith("doctor: ")
    if saved["causes"]:
        assert saved["causes"][0]["fix"] in line
    else:
        assert "doctor: τ 1.50 at K=3 on 6 builtin hold-out prompts is under 2.00 (ceiling 4)" in line
    text = log.read_text()
    every = len(doctor.CHECKS)
    assert f"$ specdraft doctor {run}" in text and f"doctor: {every}/{every} checks" in text and "exit 0 after" in text
    stages = json.loads((tmp_path / pipeline.STAGES_FILE).read_text())
    assert stages["doctor"]["exit"] == 0 and stages["doctor"]["seconds"] > 0


def test_thinking_mode_trained_in_one_mode_benched_in_the_other(tmp_path):
    """Issue 55: a drafter trained with thinking on (prepare.json's mode) and benched with it off loses τ; the
    doctor names it, with the loss where the run holds benches in both modes, and the prepare that fixes it."""
    from types import SimpleNamespace

    data, run = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    run.mkdir()
    (data / "prepare.json").write_text(json.dumps({"thinking": {"style": "think-tags", "mode": "on"},
                                                   "chat_template_kwargs": {}}))
    d = SimpleNamespace(store=SimpleNamespace(manifest={"data": {"path": str(data)}}), run=run, model="M", config={})

    def bench(name, mode, kwargs, tau, prompts="builtin-holdout"):
        (run / name).write_text(json.dumps({"config": {"thinking": {"style": "think-tags", "mode": mode},
                                                       "chat_template_kwargs": kwargs, "family": "eagle3", "k": 3,
                                                       "prompts": prompts},
                                            "methods": {"greedy": {"accept_len": 1.0}, "eagle3": {"accept_len": tau}}}))

    bench("bench.json", "on", {}, 2.4)
    finding = doctor.check_thinking_mode(d)
    assert not finding.holds and finding.evidence["trained_mode"] == "on"
    bench("bench_off.json", "off", {"enable_thinking": False}, 1.3)
    finding = doctor.check_thinking_mode(d)
    assert finding.holds and finding.estimated_tau_loss == pytest.approx(1.1)
    assert finding.summary == 'trained with thinking on, benched with thinking off {"enable_thinking": false} (bench_off.json)'
    assert "--chat-template-kwargs '{\"enable_thinking\": false}'" in finding.fix
    assert_parses(re.search(r"specdraft (.+?) \(", finding.fix).group(1), {"id": "thinking_mode"})
    bench("bench_off.json", "off", {"enable_thinking": False}, 2.3)        # measured: within the noise
    finding = doctor.check_thinking_mode(d)
    assert not finding.holds and finding.evidence["benches"]["bench_off.json"]["tau"] == 2.3
    bench("bench_natural.json", "on", {}, 3.8, prompts="natural")          # another prompt set: not compared
    assert not doctor.check_thinking_mode(d).holds
    (run / "bench_natural.json").unlink()
    (run / "bench.json").unlink()                                           # no bench in the training setting
    assert doctor.check_thinking_mode(d).holds and doctor.check_thinking_mode(d).estimated_tau_loss is None
    (data / "prepare.json").write_text(json.dumps({"counts": {}}))          # data of before the mode was recorded
    assert "skipped" in doctor.check_thinking_mode(d).evidence
