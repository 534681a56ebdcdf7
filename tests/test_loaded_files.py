"""Everything loaded is checked against what it claims (issue 14, parts 2 and 3): store shards
against their manifest, manifests and index files field by field, `train --resume` against the
run's own store, drafter weights for NaN/inf, d2t for an integer dtype, and targets for being
decoder-only causal LMs with at least 3 layers. Each case runs the CLI in-process and must exit 2
with ONE stderr line naming the file, the field and the fix, and leave existing outputs unchanged.

docs/reliability.md ("Loaded files and targets") lists the same cases as a table.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from bad_workspace import check_refusal, copy, ws  # noqa: F401  (ws is a fixture)

TRAIN = ["--epochs", "1", "--max-tokens", "64", "--val-fraction", "0", "--precision", "fp32", "--no-progress"]


@pytest.fixture(scope="module")
def lws(ws):
    """The shared workspace plus what these cases need: stores captured as float16 and from other aux
    layers (their shards get mixed into copies of the good store), and a finished 1-epoch run."""
    from specdraft.data import capture as cap
    from specdraft.train.config import resolve_config
    from specdraft.train.loop import train

    root = ws["root"]
    for name, layers, dtype in (("h-f16", [2, 4, 5], "float16"), ("h-136", [1, 3, 6], "float32")):
        cap.capture(model=ws["target"], data=root / "data", out=root / name, layers=layers, dtype=dtype,
                    shard_tokens=200, progress=False)
    cfg = resolve_config(out=str(root / "run"), store=str(root / "hidden"), vocab=str(root / "vocab.safetensors"),
                         model=ws["target"], epochs=1, max_tokens=64, val_fraction=0.0, precision="fp32",
                         progress=False)
    train(cfg)
    return ws


def train_args(ws, store, out: str) -> list:
    return ["train", "--model", ws["target"], "--store", store, "--vocab", ws["root"] / "vocab.safetensors",
            "--out", ws["root"] / out, *TRAIN]


def edit_manifest(store: Path, edit: Callable[[dict], None]) -> Path:
    manifest = json.loads((store / "manifest.json").read_text())
    edit(manifest)
    (store / "manifest.json").write_text(json.dumps(manifest))
    return store


def swap_shard(ws, new: str, donor: str, old_metadata: bool = False) -> Path:
    """A copy of the good store whose shard-00001 comes from the `donor` capture, with the manifest's
    sha256 updated to match (what two captures into one folder leave behind)."""
    from specdraft.io import sha256_file

    store = copy(ws, "hidden", new)
    shard = store / "shard-00001.safetensors"
    shutil.copyfile(ws["root"] / donor / shard.name, shard)
    if old_metadata:   # as written before shards recorded their dtype and layers
        from safetensors.torch import load_file, save_file
        tensors = load_file(str(shard))
        meta = {"specdraft": json.dumps({"format": "specdraft-hidden-store", "format_version": 1,
                                         "samples": json.loads((store / "manifest.json").read_text())
                                         ["shards"][1]["samples"]}, sort_keys=True)}
        save_file(tensors, str(shard), metadata=meta)

    def rehash(m):
        m["shards"][1]["sha256"] = sha256_file(shard)
    return edit_manifest(store, rehash)


def drafter_copy(ws, new: str, edit: Callable[[dict], None]) -> Path:
    from safetensors.torch import load_file, save_file

    folder = copy(ws, "drafter", new)
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def index_drafter(ws, new: str, entry: str) -> Path:
    """A drafter whose model.safetensors.index.json sends every tensor to `entry`."""
    from safetensors import safe_open

    folder = ws["root"] / new
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    shutil.copyfile(ws["root"] / "drafter" / "config.json", folder / "config.json")
    with safe_open(str(ws["root"] / "drafter" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(keys, entry)}))
    return folder


def odd_target(ws, new: str, config=None, weights=None, keep_tokenizer: bool = True) -> Path:
    """A folder with the tiny target's tokenizer (or none) and `config` (+ `weights`, a model)."""
    folder = ws["root"] / new
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(ws["target"], folder)
    if not keep_tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
            (folder / name).unlink(missing_ok=True)
    if config is not None:
        (folder / "model.safetensors").unlink()
        (folder / "config.json").unlink()
        (weights.save_pretrained(folder) if weights is not None else config.save_pretrained(folder))
    return folder


def prepare_args(ws, model) -> tuple[list, Path]:
    return (["prepare", "--model", model, "--conversations", ws["root"] / "good.jsonl", "--out", ws["root"] / "data"],
            ws["root"] / "data")


# ----------------------------------------------------------------------------- store vs manifest

def c_shard_float16(ws):
    return train_args(ws, swap_shard(ws, "m-f16", "h-f16"), "run-f16"), ws["root"] / "m-f16"


def c_shard_float16_old_metadata(ws):
    return train_args(ws, swap_shard(ws, "m-f16-old", "h-f16", old_metadata=True), "run-f16-old"), ws["root"] / "m-f16-old"


def c_shard_other_layers(ws):
    return train_args(ws, swap_shard(ws, "m-136", "h-136"), "run-136"), ws["root"] / "m-136"


def c_manifest_drops_shard(ws):
    store = edit_manifest(copy(ws, "hidden", "m-drop"), lambda m: m["shards"].pop())
    return train_args(ws, store, "run-drop"), store


def drop_last_shard_and_totals(m):
    last = m["shards"].pop()
    m["num_samples"], m["num_tokens"] = last["samples"][0], m["num_tokens"] - last["num_tokens"]


def c_manifest_drops_shard_verify(ws):
    store = edit_manifest(copy(ws, "hidden", "m-drop2"), drop_last_shard_and_totals)
    return ["capture", "--out", store, "--verify"], store


def c_manifest_target_null(ws):
    store = edit_manifest(copy(ws, "hidden", "m-null"), lambda m: m.update(target=None))
    return ["capture", "--out", store, "--verify"], store


def c_manifest_target_null_train(ws):
    store = edit_manifest(copy(ws, "hidden", "m-null2"), lambda m: m.update(target=None))
    return train_args(ws, store, "run-null"), store


def c_manifest_layer_ids_string(ws):
    store = edit_manifest(copy(ws, "hidden", "m-layers"), lambda m: m.update(layer_ids="2,4,5"))
    return ["capture", "--out", store, "--verify"], store


def c_manifest_hidden_size_string(ws):
    store = edit_manifest(copy(ws, "hidden", "m-hsize"), lambda m: m.update(hidden_size="64"))
    return train_args(ws, store, "run-hsize"), store


def c_manifest_shard_tokens_string(ws):
    store = edit_manifest(copy(ws, "hidden", "m-ntok"), lambda m: m["shards"][0].update(num_tokens="10"))
    return ["capture", "--out", store, "--verify"], store


# ----------------------------------------------------------------------------- checkpoints and vocab

def c_index_dotdot(ws):
    return ["import", index_drafter(ws, "d-dotdot", "../drafter/model.safetensors"), "--out",
            ws["root"] / "imp-dotdot"], ws["root"] / "drafter"


def c_index_absolute(ws):
    return ["import", index_drafter(ws, "d-abs", str(ws["root"] / "drafter" / "model.safetensors")), "--out",
            ws["root"] / "imp-abs"], ws["root"] / "drafter"


def nan_fc(tensors):
    tensors["fc.weight"][0, 0] = float("nan")


def c_nan_eval(ws):
    d = drafter_copy(ws, "d-nan", nan_fc)
    return ["eval", "--drafter", d, "--store", ws["root"] / "hidden", "--model", ws["target"], "--split", "all"], d


def c_nan_export(ws):
    d = drafter_copy(ws, "d-nan2", nan_fc)
    return ["export", d, "--out", ws["root"] / "exp-nan"], d


def c_nan_generate(ws):
    d = drafter_copy(ws, "d-nan3", nan_fc)
    return ["generate", "-p", "hi", "--model", ws["target"], "--drafter", d, "--max-new-tokens", "4",
            "--device", "cpu"], d


def c_float_d2t_vocab(ws):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ws["root"] / "vocab.safetensors"))
    path = ws["root"] / "vocab-float.safetensors"
    save_file({"d2t": tensors["d2t"].float(), "t2d": tensors["t2d"]}, str(path))
    return ["vocab", "diff", ws["root"] / "vocab.safetensors", path], path


def c_float_d2t_drafter(ws):
    d = drafter_copy(ws, "d-float", lambda t: t.update(d2t=t["d2t"].float()))
    return ["import", d, "--out", ws["root"] / "imp-float"], d


def c_resume_other_store(ws):
    run = ws["root"] / "run"
    return (["train", "--model", ws["target"], "--store", ws["root"] / "h-136", "--vocab",
             ws["root"] / "vocab.safetensors", "--out", run, "--resume", *TRAIN[:-1], "--epochs", "2",
             "--no-progress"], run)


# ----------------------------------------------------------------------------- targets

def c_bert_prepare(ws):
    from transformers import BertConfig, BertLMHeadModel

    cfg = BertConfig(vocab_size=263, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                     intermediate_size=64)
    return prepare_args(ws, odd_target(ws, "t-bert", cfg, BertLMHeadModel(cfg)))


def c_bert_info(ws):
    from transformers import BertConfig

    return ["info", "--model", odd_target(ws, "t-bert2", BertConfig(vocab_size=263, num_hidden_layers=4))], None


def c_encoder_decoder_info(ws):
    from transformers import T5Config

    return ["info", "--model", odd_target(ws, "t-t5", T5Config(vocab_size=263, num_layers=4))], None


def c_two_layers_prepare(ws):
    from specdraft.testing import save_tiny_target

    folder = ws["root"] / "t-two"
    shutil.rmtree(folder, ignore_errors=True)
    return prepare_args(ws, save_tiny_target(folder, num_layers=2))


def c_zero_layers_info(ws):
    folder = odd_target(ws, "t-zero")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 0}))
    return ["info", "--model", folder], None


def c_truncated_target(ws):
    folder = odd_target(ws, "t-trunc")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return prepare_args(ws, folder)


def c_target_missing_weight(ws):
    from safetensors.torch import load_file, save_file

    folder = odd_target(ws, "t-missing")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return prepare_args(ws, folder)


def c_target_no_tokenizer(ws):
    return ["info", "--model", odd_target(ws, "t-notok", keep_tokenizer=False)], None


@dataclass
class Case:
    name: str          # the bad input, as the docs table names it
    build: Callable    # ws -> (argv list, folder or file that must stay intact or None)
    phrase: str        # a key phrase the one-line message must contain


MATRIX = [
    Case("store shard of a float16 capture", c_shard_float16, 'shard-00001.safetensors: dtype "float16"'),
    Case("store shard of a float16 capture (older shard metadata)", c_shard_float16_old_metadata,
         "shard-00001.safetensors: tensor 'aux' is F16"),
    Case("store shard of another aux-layer capture", c_shard_other_layers, "shard-00001.safetensors: layer_ids"),
    Case("manifest lists only some shards (train)", c_manifest_drops_shard, "lists only some of its shards"),
    Case("manifest lists only some shards, totals fixed (verify)", c_manifest_drops_shard_verify,
         "does not list shard-00"),
    Case('manifest "target": null (verify)', c_manifest_target_null, "field 'target'"),
    Case('manifest "target": null (train)', c_manifest_target_null_train, "field 'target'"),
    Case("manifest layer_ids a string", c_manifest_layer_ids_string, "field 'layer_ids'"),
    Case("manifest hidden_size a string", c_manifest_hidden_size_string, "field 'hidden_size'"),
    Case("manifest shard num_tokens a string", c_manifest_shard_tokens_string, "num_tokens"),
    Case("index.json entry ../drafter/x", c_index_dotdot, "points outside the checkpoint folder"),
    Case("index.json entry an absolute path", c_index_absolute, "points outside the checkpoint folder"),
    Case("NaN drafter weight (eval)", c_nan_eval, "tensor 'fc.weight' holds NaN/inf"),
    Case("NaN drafter weight (export)", c_nan_export, "tensor 'fc.weight' holds NaN/inf"),
    Case("NaN drafter weight (generate)", c_nan_generate, "tensor 'fc.weight' holds NaN/inf"),
    Case("float d2t in a vocab file", c_float_d2t_vocab, "d2t is float32 but must be an integer tensor"),
    Case("float d2t in a drafter", c_float_d2t_drafter, "d2t is float32 but must be an integer tensor"),
    Case("train --resume with a store of other aux layers", c_resume_other_store, "aux layers: checkpoint"),
    Case("BERT target (prepare)", c_bert_prepare, "bidirectional encoder"),
    Case("BERT target (info)", c_bert_info, "bidirectional encoder"),
    Case("encoder-decoder target (info)", c_encoder_decoder_info, "encoder-decoder"),
    Case("2-layer target (prepare)", c_two_layers_prepare, "num_hidden_layers 2"),
    Case("0-layer target (info)", c_zero_layers_info, "num_hidden_layers 0"),
    Case("truncated target safetensors", c_truncated_target, "truncated or corrupt"),
    Case("target checkpoint missing a weight", c_target_missing_weight, "lacks 1 weight"),
    Case("target without tokenizer files", c_target_no_tokenizer, "no tokenizer files"),
]


@pytest.mark.parametrize("case", MATRIX, ids=[c.name for c in MATRIX])
def test_refused_with_one_line(lws, monkeypatch, capsys, case):
    check_refusal(lws, monkeypatch, capsys, case.build, case.phrase)


# ----------------------------------------------------------------------------- what still works

def test_fingerprint_same_across_loads_and_dtypes(ws):
    """Two loads of one folder name the same target, whatever the dtype (an fp16 load used to round
    the probe tensors differently) and whether the weights load here or only the config does."""
    from specdraft.targets import describe_target, load_target

    first = load_target(ws["target"]).identity
    assert load_target(ws["target"]).identity == first
    assert load_target(ws["target"], dtype="float16").identity == first
    assert load_target(ws["target"], dtype="bfloat16").identity == first
    assert describe_target(ws["target"]).identity == first


def test_resume_with_the_runs_own_store_records_it(lws):
    """A checkpoint records the data it trained on; resuming with that store still passes the checks."""
    from specdraft.train.checkpoint import latest_checkpoint
    from specdraft.train.inputs import INPUTS_FILE

    saved = json.loads((latest_checkpoint(lws["root"] / "run") / INPUTS_FILE).read_text())
    assert saved["layer_ids"] == [2, 4, 5] and saved["store"] == str(lws["root"] / "hidden")
    assert saved["target"]["fingerprint"] and saved["num_samples"] == 10


def test_good_index_and_eight_layer_target_still_load(ws, tmp_path):
    """A sharded checkpoint with plain file names imports; the tiny 8-layer target passes `info`."""
    from specdraft.formats.checkpoints import import_checkpoint, load_checkpoint
    from specdraft.targets import info

    folder = index_drafter(ws, "d-good-index", "part-1.safetensors")
    shutil.copyfile(ws["root"] / "drafter" / "model.safetensors", folder / "part-1.safetensors")
    import_checkpoint(folder, tmp_path / "imported")
    assert load_checkpoint(tmp_path / "imported")[1].aux_layer_ids == [2, 4, 5]
    assert info(ws["target"])["default_aux_layers"] == [2, 4, 5]


# ----------------------------------------------------------------------------- typed reading of side files (issue 25)

@pytest.mark.parametrize("setting, value", [("seed", "x"), ("val_fraction", [1]), ("store", 7), ("model", {"a": 1}),
                                            ("epochs", "three")])
def test_a_runs_config_yaml_has_one_schema_that_train_eval_and_report_read(tmp_path, setting, value):
    """Issue 58: config.yaml was described three times (train's RunConfig, eval's and report's field tables). Now
    eval and report read it through train/config.read_run_config: a wrong type is the same one line naming the
    file and the setting in each, and a good file reads as the RunConfig train resumes from."""
    import yaml

    from specdraft.analysis import evaluate, report
    from specdraft.errors import SpecdraftError
    from specdraft.train.config import RunConfig

    run = tmp_path / "run"
    (run / "best").mkdir(parents=True)
    good = {"store": "ws/hidden", "model": "default", "seed": 3, "val_fraction": 0.1, "epochs": 2}
    (run / "config.yaml").write_text(yaml.safe_dump(good))
    assert evaluate.run_config_of(run / "best") == report.run_config(run) == RunConfig.from_dict(good).to_dict()
    (run / "config.yaml").write_text(yaml.safe_dump({**good, "init_from": "old"}))      # a setting of an older version
    assert report.run_config(run) == RunConfig.from_dict(good).to_dict()
    (run / "config.yaml").write_text(yaml.safe_dump({**good, setting: value}))
    lines = []
    for read in (lambda: evaluate.run_config_of(run / "best"), lambda: report.run_config(run)):
        with pytest.raises(SpecdraftError) as e:
            read()
        lines.append(str(e.value))
    assert lines[0] == lines[1] and lines[0].startswith(f"{run / 'config.yaml'}: {setting} is ") and "\n" not in lines[0]
    assert not hasattr(evaluate, "RUN_CONFIG_FIELDS") and not hasattr(report, "CONFIG_FIELDS")


def test_report_with_a_wrongly_typed_bench_json_is_one_line(ws, monkeypatch, capsys):
    def build(ws):
        run = copy(ws, "drafter", "run-badbench")
        (run / "metrics.jsonl").write_text('{"split": "val", "epoch": 0, "step": 1, "tokens_seen": 5, '
                                           '"full_acc_0": 0.5}\n')
        (run / "bench.json").write_text(json.dumps({"config": [1], "methods": {}}))
        return ["report", run], run
    check_refusal(ws, monkeypatch, capsys, build, "bench.json: field 'config' is [1] (input should be a valid dictionary")


# ----------------------------------------------------------------------------- typed reading, round 3 part 3 (issue 25)

def drafter_config_readers(tmp: Path):
    """(name, schema, config.json, read(folder), good config.json) of every reader of a drafter's config.json: each
    family's parse_config (the SGLang layout's too), layout detection, and vocab's read of a drafter folder."""
    from safetensors.torch import save_file

    from specdraft import vocab
    from specdraft.formats import checkpoints
    from specdraft.model.dflash import checkpoint as dflash
    from specdraft.model.dflash.module import DFlashConfig
    from specdraft.model.dspark import checkpoint as dspark
    from specdraft.model.dspark.module import DSparkConfig
    from specdraft.model.eagle3 import checkpoint as speculators, sglang
    from specdraft.model.eagle3.config import DrafterConfig
    from specdraft.schemas.drafter import file_model

    folder = tmp / "drafter"
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"d2t": torch.zeros(3, dtype=torch.long), "t2d": torch.ones(3, dtype=torch.bool)},
              str(folder / "model.safetensors"))
    shape = dict(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=2, head_dim=4,
                 vocab_size=3, draft_vocab_size=3, aux_layer_ids=[1, 2, 3], target_num_layers=4, verifier="t")
    eagle = DrafterConfig(**shape)
    block = dict(shape, mask_token_id=0, block_size=4)
    parse = lambda module, *more: lambda f: module.parse_config(json.loads((f / "config.json").read_text()),  # noqa: E731
                                                                 str(f), *more)
    return [
        ("speculators config.json", file_model(speculators.Eagle3File, DrafterConfig), parse(speculators),
         speculators.build_config(eagle, "float32", 3, [])),
        ("sglang config.json", file_model(sglang.SGLangFile, DrafterConfig), parse(sglang, None), sglang.build_config(eagle, "float32", "x")),
        ("dflash config.json", file_model(dflash.DFlashFile, DFlashConfig), parse(dflash),
         dflash.build_config(DFlashConfig(**block), "float32", 3, [])),
        ("dspark config.json", file_model(dspark.DSparkFile, DSparkConfig), parse(dspark),
         dspark.build_config(DSparkConfig(**block, markov_rank=2), "float32", 3, [])),
        ("checkpoint layout config.json", file_model(), checkpoints.detect_layout, {"speculators_model_type": "eagle3"}),
        ("drafter config.json as a vocab", file_model(), vocab.load, {}),
    ], folder


def test_every_drafter_config_reader_names_the_file_and_field_of_a_wrong_type(tmp_path):
    """Issue 58: a drafter's config.json has one schema (schemas/drafter.py; the speculators, SGLang, DFlash, DSpark,
    layout and vocab field tables went). Generated from it: every field, nested ones and the family's drafter_config
    block too, given a value of another type is one line naming the file and the field, in every reader. A wrong
    type was a traceback before the tables (draft_vocab_size "32000" a TypeError in the drafter)."""
    from specdraft.errors import SpecdraftError

    readers, folder = drafter_config_readers(tmp_path)
    path, checked = folder / "config.json", 0
    for name, model, read, good in readers:
        path.write_text(json.dumps(good))
        read(folder)                                                    # the good document reads
        for field, doc in wrong_documents(model):
            path.write_text(json.dumps({**good, **doc}))
            with pytest.raises(SpecdraftError) as e:
                read(folder)
            assert str(e.value).startswith(f"{path}: field '{field}'") and "\n" not in str(e.value), (name, str(e.value))
            checked += 1
    assert checked >= 200


@pytest.mark.parametrize("legacy", [False, True])
def test_a_vocab_header_has_one_schema_and_a_wrong_type_is_one_line(tmp_path, legacy):
    """Issue 58: a vocab file's header is checked by its pydantic schema (schemas/vocab.py; HEADER_FIELDS went):
    each field of the wrong type is one line naming the file and the field. An older or foreign file's plain string
    keys: the counts must be digits."""
    from safetensors.torch import save_file

    from specdraft import vocab
    from specdraft.errors import SpecdraftError
    from specdraft.schemas.vocab import COUNTS, VocabHeader

    mapping = {"d2t": torch.zeros(3, dtype=torch.long), "t2d": torch.ones(3, dtype=torch.bool)}
    path = tmp_path / "vocab.safetensors"
    good = {"target_vocab_size": 3, "draft_vocab_size": 3}

    def write(doc):
        metadata = {k: str(v) for k, v in doc.items()} if legacy else {"specdraft": json.dumps(doc)}
        save_file(mapping, str(path), metadata=metadata)

    write(good)
    assert vocab.load(path).target_vocab_size == 3
    cases = [(f, doc) for f, doc in wrong_documents(VocabHeader) if not legacy or f in COUNTS]
    for field, doc in cases:
        write({**good, **doc})
        with pytest.raises(SpecdraftError) as e:
            vocab.load(path)
        assert str(e.value).startswith(f"{path}: field '{field}'") and "\n" not in str(e.value), str(e.value)
    assert len(cases) == (len(COUNTS) if legacy else len(VocabHeader.model_fields))


def test_a_metrics_line_has_one_schema_and_a_wrong_type_is_one_line(tmp_path):
    """Issue 58: a metrics.jsonl record is checked by its pydantic schema (schemas/metrics.py; RECORD_FIELDS went):
    each named field and any metric (top level or under "metrics") of the wrong type is one line naming the file,
    the line and the field; null is refused as before."""
    from specdraft import metrics
    from specdraft.errors import SpecdraftError
    from specdraft.schemas.metrics import MetricsRecord

    run = tmp_path / "run"
    run.mkdir()
    good = {"split": "val", "epoch": 0, "step": 3, "tokens_seen": 100, "lr": 1e-4, "metrics": {"loss": 2.5}}
    (run / "metrics.jsonl").write_text(json.dumps(good) + "\n")
    assert metrics.load_run(run).records[0]["loss"] == 2.5
    cases = [*wrong_documents(MetricsRecord), ("loss", {"metrics": {"loss": "low"}}), ("acc", {"acc": True}),
             ("step", {"step": None})]
    for field, doc in cases:
        (run / "metrics.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({**good, **doc}) + "\n{}\n")
        with pytest.raises(SpecdraftError) as e:
            metrics.load_run(run)
        assert str(e.value).startswith(f"{run / 'metrics.jsonl'}:2: field '{field}' is "), str(e.value)
        assert "\n" not in str(e.value)


def test_vocab_header_not_an_object_and_rates_not_numbers_are_one_line(tmp_path):
    """A vocab header "specdraft" that is not JSON or not an object, and plan --accept rates that are
    not numbers (float('x') was a traceback), name the file and the field."""
    import re

    from safetensors.torch import save_file

    from specdraft import vocab
    from specdraft.analysis.plan import load_accept
    from specdraft.errors import SpecdraftError

    mapping = {"d2t": torch.zeros(3, dtype=torch.long), "t2d": torch.ones(3, dtype=torch.bool)}
    for header, phrase in (("[1, 2]", "header field 'specdraft' is a list"),
                           ("{oops", "header field 'specdraft' is not valid JSON")):
        save_file(mapping, str(tmp_path / "v.safetensors"), metadata={"specdraft": header})
        with pytest.raises(SpecdraftError, match=re.escape(f"{tmp_path / 'v.safetensors'}: {phrase}")):
            vocab.load(tmp_path / "v.safetensors")
    accept = tmp_path / "accept.json"
    for doc, field in (({"cond_acc": [0.8, "x"]}, "cond_acc.1"), ({"cond_acc_1": "0.8"}, "cond_acc_1"),
                       ({"per_position_accept": [None]}, "per_position_accept.0"),
                       ({"methods": {"eagle3": {"cond_acc": [True]}}}, "methods.eagle3.cond_acc.0"),
                       ({"metrics": {"cond_acc_0": [1]}}, "metrics.cond_acc_0")):
        accept.write_text(json.dumps(doc))
        with pytest.raises(SpecdraftError, match=re.escape(f"{accept}: field '{field}' is ")):
            load_accept(str(accept))


@pytest.mark.parametrize("reader", ["metrics.jsonl", "metrics.jsonl (resume)", "config.yaml", "journal.md",
                                    "inputs.json", "--accept JSON"])
def test_bad_utf8_is_one_line_naming_the_file(tmp_path, reader):
    """Bytes that are not UTF-8 in each text file specdraft reads: one line naming the file (a
    UnicodeDecodeError traceback from load_run, load_yaml, the journal and truncate_after)."""
    from specdraft import journal
    from specdraft.analysis.plan import load_accept
    from specdraft.errors import SpecdraftError
    from specdraft.metrics import MetricsLog, load_run
    from specdraft.train.config import load_yaml

    run = tmp_path / "run"
    run.mkdir()
    files = {"metrics.jsonl": (run / "metrics.jsonl", lambda: load_run(run)),
             "metrics.jsonl (resume)": (run / "metrics.jsonl",
                                        lambda: MetricsLog(run, True, None).truncate_after(3)),
             "config.yaml": (run / "config.yaml", lambda: load_yaml(run / "config.yaml")),
             "journal.md": (run / "journal.md", lambda: journal.read(run)),
             "inputs.json": (run / "inputs.json", lambda: __import__("specdraft.io").io.read_json(run / "inputs.json")),
             "--accept JSON": (run / "accept.json", lambda: load_accept(str(run / "accept.json")))}
    path, read = files[reader]
    path.write_bytes(b'{"step": 1, "split": "val"}\n' + "é".encode("latin-1") + b"\n")
    with pytest.raises(SpecdraftError) as e:
        read()
    assert str(e.value).startswith(f"{path}: not ") and "\n" not in str(e.value), str(e.value)


def test_config_yaml_with_a_key_that_is_not_a_name_is_one_line(tmp_path):
    from specdraft.errors import SpecdraftError
    from specdraft.train.config import load_yaml

    (tmp_path / "c.yaml").write_text("1: 2\nepochs: 3\n")
    with pytest.raises(SpecdraftError, match="setting 1 is not a name"):
        load_yaml(tmp_path / "c.yaml")


@pytest.mark.parametrize("field, wrong", [("out", 3), ("num_speculative_tokens", "two"), ("num_speculative_tokens", 0),
                                          ("layout", ["speculators"]), ("dtype", {"a": 1})])
def test_an_export_record_has_one_typed_reader(tmp_path, field, wrong):
    """EXPORT/export.json, read by the report, the doctor and the recipe through schemas.exports (issue 58: one
    schema per file, kept beside the export): a field of the wrong type is one line naming the file and the field,
    in every reader. A record naming another run is not this run's export."""
    from specdraft.analysis import report
    from specdraft.errors import SpecdraftError
    from specdraft.schemas import exports

    run, export = tmp_path / "run", tmp_path / "e"
    run.mkdir()
    export.mkdir()
    entry = {"run": str(run.resolve()), "layout": "speculators", "dtype": "bfloat16", "num_speculative_tokens": 2}
    (export / "export.json").write_text(json.dumps(entry))
    assert exports.exports_of(run)[0].num_speculative_tokens == 2 and report.served_k(run) == 2
    assert exports.exports_of(run)[0].out == str(export.resolve())
    (export / "export.json").write_text(json.dumps({**entry, "run": str(tmp_path / "other")}))
    assert exports.exports_of(run) == [] and report.served_k(run) is None
    (export / "export.json").write_text(json.dumps({**entry, field: wrong}))
    for read in (lambda r: exports.read_export(export), report.served_k, report.export_html):
        with pytest.raises(SpecdraftError, match=rf"export.json: field '{field}' is "):
            read(run)


def wrong_value(model, field: str) -> object:
    """A JSON value the schema refuses at `field` (the first of a number, a string, a list, an object, a bool)."""
    from pydantic import ValidationError

    for candidate in (5, "x", [1], {"a": 1}, True):
        try:
            model.model_validate({field: candidate})
        except ValidationError:
            return candidate
    raise AssertionError(f"{model.__name__}.{field} takes any JSON value")


def wrong_documents(model, prefix: str = ""):
    """(dotted field, a document holding a wrong value there) for every field of a schema and of the models
    nested in it (a field that is a model, or a dict or list of models: entry 'x' or item 0)."""
    import types
    import typing

    from pydantic import BaseModel

    for field, info in model.model_fields.items():
        name = f"{prefix}{field}"
        yield name, {field: wrong_value(model, field)}
        union = typing.get_origin(info.annotation) in (typing.Union, types.UnionType)
        args = [a for a in (typing.get_args(info.annotation) if union else (info.annotation,)) if a is not type(None)]
        for arg in args:
            inner = typing.get_args(arg)
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from ((f, {field: d}) for f, d in wrong_documents(arg, f"{name}."))
            elif typing.get_origin(arg) is dict and isinstance(inner[-1], type) and issubclass(inner[-1], BaseModel):
                yield from ((f, {field: {"x": d}}) for f, d in wrong_documents(inner[-1], f"{name}.x."))
            elif typing.get_origin(arg) is list and isinstance(inner[0], type) and issubclass(inner[0], BaseModel):
                yield from ((f, {field: [d]}) for f, d in wrong_documents(inner[0], f"{name}.0."))


def schema_readers(tmp: Path):
    """(file, pydantic model, read(file)[, key]) of every reader of the files in specdraft/schemas; with a key, the
    file is an object of such models (stages.json: {stage: Stage}) and the documents go under it."""
    from types import SimpleNamespace

    from specdraft.analysis import evaluate, report
    from specdraft.data import prepared
    from specdraft.formats import card
    from specdraft.schemas import bench, doctor, eval as eval_schema, inputs as I, plan, prepare as P, probe, stages
    from specdraft.train import inputs as train_inputs

    run = tmp / "run"
    (run / "best").mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("")
    (run / "config.yaml").write_text("epochs: 1\n")
    data = SimpleNamespace(source="s", layer_ids=[], hidden_size=3, target={"fingerprint": "s"},
                           identity={"data_fingerprint": "s", "num_samples": 3, "num_tokens": 3})
    resume = lambda: train_inputs.check_resume_inputs(run / "best", SimpleNamespace(  # noqa: E731
        config=SimpleNamespace(aux_layer_ids=[])), data)
    inputs = run / "best" / I.INPUTS_FILE
    ws = tmp / "ws"
    (ws / "runs" / "r").mkdir(parents=True, exist_ok=True)
    return [(inputs, I.InputsRecord, lambda: report.checkpoint_inputs(run)),
            (inputs, I.InputsRecord, lambda: evaluate.trained_store_of(run / "best")),
            (inputs, I.InputsRecord, resume),
            (inputs, I.InputsRecord, lambda: card.training_inputs(run / "best")),
            (tmp / "data" / P.META, P.PrepareRecord, lambda: prepared.prepared_meta_of({"data": {"path": str(tmp / "data")}})),
            (tmp / "data" / P.META, P.PrepareRecord, lambda: P.read_prepare_record(tmp / "data" / P.META)),
            (run / "plan.json", plan.PlanFile, lambda: report.plan_html(run)),
            (run / "bench.json", bench.BenchFile, lambda: report.headline_html(run)),
            (run / "bench.json", bench.BenchFile, lambda: report.bench_html(run)),
            (run / "bench_natural.json", bench.BenchFile, lambda: card.tau_measurements(run)),
            (run / "eval.json", eval_schema.EvalFile, lambda: report.eval_html(run)),
            (run / "eval.json", eval_schema.EvalFile, lambda: card.tau_measurements(run)),
            (run / "probe.json", probe.ProbeResult, lambda: report.results_html(run)),
            (run / "doctor.json", doctor.DoctorFile, lambda: report.doctor_html(run)),
            (ws / stages.STAGES_FILE, stages.Stage, lambda: report.recipe_stages(ws / "runs" / "r"), "x")]


def test_every_schema_reader_names_the_file_and_field_of_a_wrong_type(tmp_path):
    """Generated from each pydantic schema in specdraft/schemas: every field (nested ones too) given a value of
    another type is one line naming the file and the field, in every reader of that file (issue 58: one schema per file, and
    the readers that went around it, such as the model card's, now go through it)."""
    from specdraft.errors import SpecdraftError

    checked = 0
    for path, model, read, *key in schema_readers(tmp_path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        read()                                                          # every field optional: {} reads
        for field, doc in wrong_documents(model):
            field, doc = (f"{key[0]}.{field}", {key[0]: doc}) if key else (field, doc)
            path.write_text(json.dumps(doc))
            with pytest.raises(SpecdraftError) as e:
                read()
            assert str(e.value).startswith(f"{path}: field '{field}'") and "\n" not in str(e.value), str(e.value)
            checked += 1
        path.unlink()                                                   # the next reader may read it too
    assert checked >= 100


def test_each_schema_file_has_one_schema_in_the_code():
    """No second description of a schema file's fields: a *_FIELDS table (or any dict) typing a field name that
    only one of the files in specdraft/schemas holds is a second schema of that file."""
    import re

    from specdraft.schemas import (bench, doctor, drafter, eval as eval_schema, exports, inputs, plan, prepare, probe,
                                   stages)

    own = {"speculators_model_type", "transformer_layer_config", "speculators_config", "data_fingerprint", "store_format", "chat_template_sha256", "num_speculative_tokens", "speedup_over_plain",
           "per_position_accept", "accept_len_by_k", "cond_acc", "verify_ms", "tokens_per_cycle", "estimated_tau_loss",
           "verdict", "tokens_per_s"}
    fields = set().union(*(m.model_fields for m in (inputs.InputsRecord, prepare.PrepareRecord, exports.ExportRecord,
                                                    bench.MethodResult, eval_schema.EvalFile, plan.PlanFile,
                                                    plan.Option, doctor.Cause, probe.ProbeResult, probe.Best,
                                                    stages.Stage, drafter.DrafterConfigFile)))
    assert own <= fields
    src = Path(__file__).resolve().parents[1] / "src" / "specdraft"
    found = []
    for path in src.rglob("*.py"):
        if path.parent.name == "schemas":
            continue
        for name in own:
            if re.search(rf'"{name}"\s*:\s*\(?\s*(str|int|float|dict|list|bool|NUMBER)\b(?!\s*\()', path.read_text()):
                found.append(f"{path.relative_to(src)}: {name}")
    assert not found, found

