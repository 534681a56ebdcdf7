"""Nothing lost, round 4 (issue 37): one test (or a few) per class of the round. Each runs the CLI
in-process and asserts exit 2 with one stderr line naming the file, the field and the fix, with
earlier outputs byte-identical (bad_workspace.check_refusal), or that the result is right."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bad_workspace import run_cli, ws  # noqa: F401  (ws is a fixture)


# ----------------------------------------------------------------------------- 7. errors you can type

def test_error_text_is_never_read_as_markup(ws, monkeypatch, capsys):
    """A message holding `[/b]` printed whole (rich raised MarkupError), a folder run[lr=3e-3]
    named whole (rich ate `[lr=3e-3]` as a style tag)."""
    for name in ("run[lr=3e-3]", "x[/b]"):
        folder = ws["root"] / name
        folder.mkdir(parents=True, exist_ok=True)   # x[/b] is x[ / b]: the path still holds [/b]
        code, err, _ = run_cli(monkeypatch, capsys, ["compare", folder])
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and "Traceback" not in err, err
        assert len(lines) == 1 and f"{folder}: no metrics.jsonl" in lines[0], err


def test_old_flag_names_point_to_the_new_ones(ws, monkeypatch, capsys):
    code, err, _ = run_cli(monkeypatch, capsys, ["plan", "--accept", "0.5", "-k", "3"])
    assert code == 2 and "No such option: -k (Possible options: --max-k)" in err, err
    out = ws["root"] / "bench-old.json"
    code, err, _ = run_cli(monkeypatch, capsys, ["bench", "--json", out])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert f"--json {out}: --json takes no value" in lines[0] and f"--out {out}" in lines[0], err
    assert not out.exists()


# ----------------------------------------------------------------------------- 4. every reader typed

def test_nan_and_inf_in_json_files_and_numeric_flags_are_one_line(ws, monkeypatch, capsys):
    for value in ("nan", "inf", "-inf"):
        code, err, _ = run_cli(monkeypatch, capsys,
                               ["plan", "--accept", "0.8,0.6", "--draft-ms", "1", "--verify-ms", value])
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and f"--verify-ms {value}: every value must be a finite number" in err, err
    accept = ws["root"] / "accept-nan.json"
    accept.write_text('{"cond_acc": [0.8, NaN]}')
    code, err, _ = run_cli(monkeypatch, capsys, ["plan", "--accept", accept, "--draft-ms", "1"])
    assert code == 2 and f"{accept}: field 'cond_acc.1' is nan, expected a finite number" in err, err
    manifest = json.loads((ws["root"] / "hidden" / "manifest.json").read_text())
    store = ws["root"] / "hidden-inf"
    store.mkdir(exist_ok=True)
    (store / "manifest.json").write_text(json.dumps({**manifest, "num_tokens": float("inf")}))
    code, err, _ = run_cli(monkeypatch, capsys, ["train", "--store", store, "--vocab", ws["root"] / "vocab.safetensors",
                                                 "--model", ws["target"], "--out", ws["root"] / "run-inf"])
    assert code == 2 and "manifest.json: field 'num_tokens' is inf, expected a finite number" in err, err
    assert not (ws["root"] / "run-inf").exists()


@pytest.mark.parametrize("timings", [
    {"24x40": {"3": {"linear": float("nan"), "mm": 0.5}}},      # NaN: every comparison false
    {"24x40": {"3": {"linear": "1", "mm": 0.5}}},               # a string
    {"24x40": {"3": [1.0, 0.5]}},                               # another layout
    {"24x40": {"three": {"linear": 1.0, "mm": 0.5}}},           # a row count that is not a number
    {"24x40": 7},
    [1, 2],
])
def test_the_kernel_cache_is_never_an_error(timings, tmp_path, monkeypatch):
    import torch
    from specdraft import kernels

    monkeypatch.setattr(kernels, "_TABLES", {})
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    path = kernels.cache_file(kernels.machine_key(torch.float32))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"timings_ms": timings}))
    shape, calls = (24, 40), []

    def timer(s, rows):
        calls.append(rows)
        return {"mm": 0.5, "linear": 1.0} if rows == 3 else {"mm": 1.0, "linear": 0.5}
    flags = kernels.kernel_table([shape], timer=timer).use_mm(shape)
    assert flags[3] and not flags[2] and calls            # measured again, the measurement used
    saved = json.loads(path.read_text())["timings_ms"]["24x40"]
    assert saved["3"] == {"mm": 0.5, "linear": 1.0}


# ----------------------------------------------------------------------------- 3. no default-shape assumption

@pytest.fixture(scope="module")
def shapes(ws):
    """Stores of other shapes than the default and a short run on each: compact (no `last`), two
    aux layers, and two --part halves trained as one."""
    from specdraft.data.capture import capture
    from specdraft.train.config import RunConfig
    from specdraft.train.loop import train

    root = ws["root"]
    stores = {"compact": dict(store_format="compact"), "aux2": dict(layers=[2, 4]),
              "part1": dict(part=(1, 2)), "part2": dict(part=(2, 2))}
    for name, how in stores.items():
        capture(model=ws["target"], data=root / "data", out=root / f"hidden-{name}", dtype="float32",
                progress=False, **{"layers": [2, 4, 5], **how})
    runs = {"compact": str(root / "hidden-compact"), "aux2": str(root / "hidden-aux2"),
            "parts": [str(root / "hidden-part1"), str(root / "hidden-part2")]}
    for name, store in runs.items():
        train(RunConfig(out=str(root / f"run-{name}"), store=store,
                        vocab=str(root / "vocab.safetensors"), model=ws["target"], max_tokens=512, epochs=1,
                        progress=False, precision="fp32", val_fraction=0.25, ttt_steps=2))
    return root


@pytest.mark.parametrize("layers, named", [("4", "aux layer 4"), ("1,2,4,5,6", "aux layer 4, aux layer 5, aux layer 6")])
def test_capture_nan_check_names_the_layer_for_any_aux_count(ws, layers, named, monkeypatch, capsys):
    """One aux layer was an IndexError (the check counted 3), five named only `last`."""
    from bad_workspace import check_refusal

    out = ws["root"] / f"h-nan-{layers.replace(',', '-')}"
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (
        ["capture", "--model", ws["nan_target"], "--prepared", ws["root"] / "data-nan", "--out", out,
         "--store-dtype", "float32", "--layers", layers], ws["root"] / "data-nan"), "non-finite hidden states", True)
    assert f"in {named}, last;" in line, line

@pytest.mark.parametrize("stage", ["capture", "prepare"])
def test_a_part_with_no_samples_is_one_line(ws, stage, monkeypatch, capsys):
    """--part 11/11 of 10 samples: capture ended in max() of an empty list, prepare blamed the filters."""
    from bad_workspace import check_refusal

    out = ws["root"] / f"{stage}-part11"
    given = {"capture": ["--prepared", ws["root"] / "data", "--store-dtype", "float32"],
             "prepare": ["--conversations", ws["root"] / "good.jsonl"]}[stage]
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (
        [stage, "--model", ws["target"], *given, "--out", out, "--part", "11/11"], ws["root"] / "data"),
        "--part 11/11: no samples in this part")
    assert "split into at most 10 parts" in line, line
    assert not out.exists()

@pytest.mark.parametrize("name", ["compact", "aux2", "parts"])
def test_doctor_on_stores_of_other_shapes(shapes, name, monkeypatch, capsys):
    code, err, out = run_cli(monkeypatch, capsys, ["doctor", shapes / f"run-{name}", "--json"])
    assert code == 0 and "Traceback" not in err, err
    result = json.loads(out)
    assert result["tau_held_out"] >= 1.0
    assert {c["id"] for c in result["checked"] + result["causes"]} >= {"vocab_coverage", "aux_layers"}


@pytest.mark.parametrize("file, text, field", [
    ("config.yaml", None, "ttt_steps is 'two'"),
    ("plan.json", '{"verify_ms": [1.0, "2"], "draft_ms": 0.5}', "field 'verify_ms.1' is \"2\""),
    ("plan.json", '{"verify_ms": [1.0, 2.0]}', "field 'draft_ms' is missing"),
    ("export/export.json", '{"run": "RUN", "num_speculative_tokens": "3"}', "field 'num_speculative_tokens' is \"3\""),
    ("export/export.json", '{"run": "RUN", "epoch": -1}', "field 'epoch' is -1"),
    ("exports.json", '{"exports": [{"out": 3, "num_speculative_tokens": 3}]}', "field 'exports.0.out' is 3"),
])
def test_doctor_reads_its_inputs_typed(shapes, tmp_path, file, text, field, monkeypatch, capsys):
    """(class 4) Wrong types in config.yaml, plan.json, an export's export.json (found beside the run) or an older
    run's exports.json: one line naming the file and the field, never a traceback; nothing in the run changes."""
    from bad_workspace import tree_hash

    run = tmp_path / "run"
    shutil.copytree(shapes / "run-aux2", run)
    path = (run if "/" not in file else tmp_path) / file
    path.parent.mkdir(exist_ok=True)
    if file == "config.yaml":
        path.write_text(path.read_text().replace("ttt_steps: 2", "ttt_steps: two"))
    else:
        path.write_text(text.replace("RUN", str(run.resolve())))
    if file == "plan.json":   # round_cost reads plan.json only for a run with an export
        (tmp_path / "export").mkdir()
        (tmp_path / "export" / "export.json").write_text(json.dumps({"run": str(run.resolve()),
                                                                     "num_speculative_tokens": 2}))
    before = tree_hash(run)
    code, err, _ = run_cli(monkeypatch, capsys, ["doctor", run])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: {path}: ") and field in lines[0], lines[0]
    assert tree_hash(run) == before


# ----------------------------------------------------------------------------- 5. outputs never over inputs

@pytest.mark.parametrize("name", ["eval.json", "bench.json", "exports.json"])
def test_report_out_never_replaces_a_result_it_reads(shapes, tmp_path, name, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(shapes / "run-aux2", run)
    (run / name).write_text('{"kept": true}\n')
    code, err, _ = run_cli(monkeypatch, capsys, ["report", run, "--out", run / name])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and f"--out {run / name}: is an existing .json file" in lines[0], err
    assert (run / name).read_text() == '{"kept": true}\n'


def test_exports_keep_their_own_records_and_never_write_the_run(shapes, tmp_path):
    """Issue 58: two exports of one run each write their record in their own folder (EXPORT/export.json), so
    neither can lose the other's (both wrote one shared RUN/exports.json before, which needed a lock); the run
    folder is left as it was, and exports_of finds both beside the run, the latest last."""
    import os

    from bad_workspace import tree_hash
    from specdraft.formats.checkpoints import export
    from specdraft.schemas.exports import exports_of

    run = tmp_path / "ws" / "runs" / "a"
    shutil.copytree(shapes / "run-aux2", run)
    before = tree_hash(run)
    for out, k in (("A", 2), ("B", 3)):
        export(run, tmp_path / "ws" / "export" / out, "speculators", speculative_tokens=k)
    os.utime(tmp_path / "ws" / "export" / "A" / "export.json", (1e9, 1e9))     # A is the older one
    assert tree_hash(run) == before and not (run / "exports.json").exists()
    found = exports_of(run)
    assert [(Path(e.out).name, e.num_speculative_tokens, e.layout) for e in found] == [("A", 2, "speculators"),
                                                                                      ("B", 3, "speculators")]
    assert {e.run for e in found} == {str(run.resolve())} and found[0].checkpoint.endswith("best")
    shutil.move(tmp_path / "ws", tmp_path / "moved")          # a workspace copied elsewhere keeps its pairs
    assert [Path(e.out).name for e in exports_of(tmp_path / "moved" / "runs" / "a")] == ["A", "B"]


# ----------------------------------------------------------------------------- 2. no setting dropped

@pytest.fixture(scope="module")
def dflash_drafter(ws):
    """A DFlash drafter of the tiny target with the defaults: one layer, a block of 4."""
    from specdraft.families import family
    from specdraft.formats.checkpoints import save_checkpoint
    from specdraft.targets import load_target
    from specdraft.train.checkpoint import drafter_tensors
    from specdraft import vocab as vocab_mod

    fam, target = family("dflash"), load_target(ws["target"])
    vocab = vocab_mod.load(ws["root"] / "vocab.safetensors")
    dcfg = fam.new_config(target.config, vocab.draft_vocab_size, [2, 4, 5], ws["target"])
    drafter = fam.build(dcfg)
    fam.init_from_target(drafter, target, vocab.d2t, vocab.t2d)
    save_checkpoint(ws["root"] / "dflash-drafter", drafter_tensors(drafter), dcfg)
    return ws["root"] / "dflash-drafter"


@pytest.mark.parametrize("family, flags, named", [
    ("dflash", ["--draft-layers", "2", "--ttt-steps", "5"],
     "--draft-layers sets num_layers 2 but the drafter has 1; --ttt-steps sets block_size 6 but the drafter has 4"),
    ("dflash", ["--fc-norm"], "--fc-norm True: an EAGLE-3 option"),
    ("eagle3", ["--fc-norm", "--norm-output"], "--norm-output sets norm_output True but the drafter has False; "
                                                "--fc-norm sets fc_norm True but the drafter has False"),
])
def test_from_pretrained_refuses_the_settings_it_would_drop(ws, dflash_drafter, family, flags, named,
                                                            monkeypatch, capsys):
    """`train --from-pretrained` kept the drafter's shape and recorded the flags in config.yaml anyway."""
    from bad_workspace import check_refusal

    drafter = dflash_drafter if family == "dflash" else ws["root"] / "drafter"
    out = ws["root"] / f"run-pretrained-{family}-{flags[0]}"
    line = check_refusal(ws, monkeypatch, capsys, lambda ws: (
        ["train", "--family", family, "--from-pretrained", drafter, *flags, "--store", ws["root"] / "hidden",
         "--vocab", ws["root"] / "vocab.safetensors", "--model", ws["target"], "--out", out, "--epochs", "1",
         "--no-progress"], drafter), named, after_start=True)
    assert not (out / "config.yaml").exists(), line


# ----------------------------------------------------------------------------- 1. identity of the whole model and data

@pytest.fixture(scope="module")
def scaled_target(ws):
    """The tiny target with layer 0's down_proj scaled x3: embeddings and norms unchanged."""
    from safetensors.torch import load_file, save_file

    folder = ws["root"] / "scaled_target"
    if not folder.exists():
        shutil.copytree(ws["target"], folder)
        weights = load_file(str(folder / "model.safetensors"))
        weights["model.layers.0.mlp.down_proj.weight"] *= 3
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_the_fingerprint_sees_every_layer(ws, scaled_target, monkeypatch, capsys):
    from specdraft.targets import identity_of, load_target

    mine, scaled = load_target(ws["target"]), load_target(str(scaled_target))
    assert mine.identity["fingerprint_v1"] == scaled.identity["fingerprint_v1"]   # what version 1 saw
    assert mine.identity["fingerprint"] != scaled.identity["fingerprint"]
    assert identity_of(scaled.model, scaled.name) == scaled.identity        # loaded weights = checkpoint slices
    for args in (["train", "--store", ws["root"] / "hidden", "--vocab", ws["root"] / "vocab.safetensors",
                  "--out", ws["root"] / "run-scaled"],
                 ["eval", "--drafter", ws["root"] / "drafter", "--store", ws["root"] / "hidden"]):
        code, err, _ = run_cli(monkeypatch, capsys, [*args, "--model", scaled_target])
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and lines[-1].startswith("error:") and "fingerprint" in lines[-1], err
    assert not (ws["root"] / "run-scaled" / "config.yaml").exists()


def test_a_store_of_the_older_fingerprint_kind_is_still_its_targets(ws, tmp_path, monkeypatch, capsys):
    """A store captured before fingerprint version 2 recorded the embeddings-and-norms kind: it is
    still accepted for its target (and refused for another)."""
    from rich.console import Console

    from specdraft import targets
    from specdraft.data.capture import capture
    from specdraft.data.prepare import prepare

    def version_1(cfg, probes, name, layer_rows=None):   # what a capture before version 2 recorded
        identity = fingerprint(cfg, probes, name)
        return {k: v for k, v in identity.items() if k not in ("fingerprint_version", "fingerprint_v1")}
    fingerprint = targets.fingerprint
    store = tmp_path / "hidden-v1"
    with monkeypatch.context() as m:
        m.setattr(targets, "fingerprint", version_1)   # a workspace prepared and captured before version 2
        prepare(model=ws["target"], source=str(ws["root"] / "good.jsonl"), out=tmp_path / "data-v1",
                console=Console(stderr=True, quiet=True))
        capture(model=ws["target"], data=tmp_path / "data-v1", out=store, layers=[2, 4, 5], dtype="float32",
                progress=False)
    recorded = json.loads((store / "manifest.json").read_text())["target"]
    assert "fingerprint_version" not in recorded
    assert recorded["fingerprint"] == targets.load_target(ws["target"]).identity["fingerprint_v1"]
    out = tmp_path / "eval.json"
    code, err, _ = run_cli(monkeypatch, capsys, ["eval", "--drafter", ws["root"] / "drafter", "--store", store,
                                                 "--model", ws["target"], "--out", out])
    assert code == 0 and out.is_file(), err
    code, err, _ = run_cli(monkeypatch, capsys, ["eval", "--drafter", ws["root"] / "drafter", "--store", store,
                                                 "--model", ws["other"]])
    assert code == 2 and "fingerprints differ" in err, err


def test_the_same_samples_twice_are_refused(ws, tmp_path, monkeypatch, capsys):
    """`train --store cap --store <a copy of cap>` trained on every sample twice, val samples in training."""
    copy = tmp_path / "hidden-copy"
    shutil.copytree(ws["root"] / "hidden", copy)
    out = tmp_path / "run-twice"
    code, err, _ = run_cli(monkeypatch, capsys, ["train", "--store", ws["root"] / "hidden", "--store", copy,
                                                 "--vocab", ws["root"] / "vocab.safetensors", "--model", ws["target"],
                                                 "--out", out])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "the same samples twice" in lines[-1] and "data.fingerprint" in lines[-1], err
    assert not (out / "config.yaml").exists()


def test_parts_train_exactly_as_the_one_store(ws, shapes, tmp_path):
    """--part 2/2 and 1/2 (any order), trained together, give the metrics of the run on the one store."""
    from specdraft.train.config import RunConfig
    from specdraft.train.loop import train

    def timeless(record: dict) -> dict:
        return {k: v for k, v in record.items() if not any(w in k for w in ("time", "per_s", "elapsed", "seconds"))}

    logs = {}
    for name, store in (("whole", str(shapes / "hidden")),
                        ("parts", [str(shapes / "hidden-part2"), str(shapes / "hidden-part1")])):
        train(RunConfig(out=str(tmp_path / name), store=store, vocab=str(shapes / "vocab.safetensors"),
                        model=ws["target"], max_tokens=512, epochs=2, progress=False, precision="fp32",
                        val_fraction=0.25, seed=0))
        logs[name] = [timeless(json.loads(line)) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert len(logs["whole"]) > 2 and logs["parts"] == logs["whole"]


# ----------------------------------------------------------------------------- 6. a failed write never blocks its fix

def test_a_failed_capture_never_blocks_the_fix_its_error_suggests(ws, tmp_path, monkeypatch, capsys):
    """A capture that fails before its first shard left a manifest: the re-run its error suggests
    (--store-dtype float32, with or without --resume) was refused as 'already holds files' or
    'store has dtype bfloat16'. Now it starts over (nothing was captured), and succeeds once the
    cause is gone."""
    out = tmp_path / "h-failed"
    base = ["capture", "--prepared", ws["root"] / "data-nan", "--out", out]
    for extra in (["--store-dtype", "bfloat16"], ["--store-dtype", "float32"], ["--store-dtype", "float16", "--resume"]):
        code, err, _ = run_cli(monkeypatch, capsys, [*base, "--model", ws["nan_target"], *extra])
        last = [line for line in err.splitlines() if line.strip()][-1]
        assert code == 2 and "non-finite hidden states" in last, err
        assert json.loads((out / "manifest.json").read_text())["shards"] == []
    code, err, _ = run_cli(monkeypatch, capsys, ["capture", "--prepared", ws["root"] / "data", "--out", out,
                                                 "--model", ws["target"], "--store-dtype", "float32"])
    assert code == 0 and "held only the manifest of a capture that wrote no shard" in err, err
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_the_dflash_block_limit_holds_in_every_consumer(ws, dflash_drafter, command, monkeypatch, capsys):
    """(class 3) A DFlash drafter with a block of 4 drafts at most 3 tokens: export refused more, and
    now generate and eval do too (they drafted from slots it never trained, or failed deep inside)."""
    args = {"generate": ["generate", "--prompt", "hi", "--max-new-tokens", "4", "--method", "dflash"],
            "eval": ["eval", "--store", ws["root"] / "hidden"]}[command]
    code, err, _ = run_cli(monkeypatch, capsys, [*args, "--drafter", dflash_drafter, "--model", ws["target"],
                                                 "-k", "5"])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert "-k 5: this dflash drafter was trained to draft 3 tokens per round" in lines[-1], err


def test_capture_verify_finds_nan_behind_a_matching_sha256(ws, tmp_path, monkeypatch, capsys):
    """(class 4) An fp8 shard whose aux values are all NaN, its sha256 updated in the manifest, passed
    `capture --verify` (and eval reported τ 1.0 on it)."""
    import hashlib

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from specdraft.data.capture import capture

    store = tmp_path / "h-fp8"
    capture(model=ws["target"], data=ws["root"] / "data", out=store, layers=[2, 4, 5], store_format="fp8",
            progress=False)
    code, err, out = run_cli(monkeypatch, capsys, ["capture", "--verify", "--out", store])
    assert code == 0, err
    shard = store / "shard-00000.safetensors"
    with safe_open(str(shard), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(shard))
    tensors["aux"] = torch.full_like(tensors["aux"].float(), float("nan")).to(tensors["aux"].dtype)
    save_file(tensors, str(shard), metadata=metadata)
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["shards"][0]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    (store / "manifest.json").write_text(json.dumps(manifest))
    code, err, _ = run_cli(monkeypatch, capsys, ["capture", "--verify", "--out", store])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert f"{shard}: tensor 'aux' holds NaN or inf (token row 0)" in lines[0], err


@pytest.mark.parametrize("flags, phrase", [
    (["--methods", "greedy,ngram", "--tree", "2,2,3"], "--tree 2,2,3: no method in --methods greedy,ngram drafts a tree"),
    (["--methods", "greedy,plain", "-k", "4"], "-k 4: no method in --methods greedy,plain drafts"),
])
def test_bench_refuses_settings_no_method_uses(ws, flags, phrase, monkeypatch, capsys):
    """(class 2) bench measured and recorded --tree / -k on methods that never read them."""
    out = ws["root"] / "bench-unused.json"
    code, err, _ = run_cli(monkeypatch, capsys, ["bench", "--model", ws["target"], *flags, "--out", out])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and phrase in lines[0], err
    assert not out.exists()


@pytest.mark.parametrize("engine, flags, phrase", [
    ("hf", ["--engine-args", '{"max_model_len": 512}'], "--engine-args: vLLM settings, but --engine hf runs transformers"),
    ("hf", ["--tensor-parallel-size", "2"], "--tensor-parallel-size: vLLM settings, but --engine hf"),
    ("auto", ["--engine-args", '{"max_model_len": 512}'], "but --engine auto runs transformers here"),
])
@pytest.mark.parametrize("stage", ["prepare", "capture"])
def test_vllm_settings_are_refused_where_transformers_runs(ws, stage, engine, flags, phrase, monkeypatch, capsys):
    """(class 2) --engine-args and -tp took no effect under --engine hf (or auto on a CPU) and no word said so."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # auto means transformers on this machine
    out = ws["root"] / f"engine-unused-{stage}"
    source = (["--conversations", ws["root"] / "good.jsonl", "--regenerate"] if stage == "prepare"
              else ["--prepared", ws["root"] / "data"])
    code, err, _ = run_cli(monkeypatch, capsys, [stage, "--model", ws["target"], *source, "--engine", engine,
                                                 *flags, "--out", out])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and phrase in lines[0] and "pass --engine vllm, or drop" in lines[0], err
    assert not out.exists()


def test_plan_max_k_beyond_a_dflash_block_names_plans_flag(ws, dflash_drafter, monkeypatch, capsys):
    """(class 3 and 7) plan's draft timer refused `-k 6`, a flag plan does not have."""
    code, err, _ = run_cli(monkeypatch, capsys, ["plan", "--drafter", dflash_drafter, "--model", ws["target"],
                                                 "--accept", "0.8,0.6", "--verify-ms", "1,1.1", "--max-k", "6"])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "--max-k 6: --drafter" in lines[0] and "pass --max-k 3 or less" in lines[0], err
