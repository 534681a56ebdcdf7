"""The bad-input matrix: every case runs the CLI in-process through `specdraft.cli.main()` and must
exit 2 with ONE stderr line that names the problem, no traceback, and existing outputs unchanged.

docs/reliability.md lists the same matrix as a table; `MATRIX` below is the source of truth.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from bad_workspace import LAYERS, check_refusal, conv, copy, write_jsonl, ws  # noqa: F401  (ws is a fixture)

# ----------------------------------------------------------------------------- the cases


@dataclass
class Case:
    name: str          # the bad input, as the docs table names it
    build: Callable    # ws -> (argv list, folder or file that must stay intact or None)
    phrase: str        # a key phrase the one-line message must contain
    after_start: bool = False   # fails mid-run: earlier progress lines are allowed, the error is the last line


def c_not_json(ws):
    f = write_jsonl(ws["root"] / "notjson.jsonl", [conv(), "{not json", conv()])
    return ["prepare", "--model", ws["target"], "--conversations", f, "--out", ws["root"] / "data"], ws["root"] / "data"


def c_unknown_role(ws):
    f = write_jsonl(ws["root"] / "role.jsonl", [{"messages": [{"role": "wizard", "content": "x"}]}])
    return ["prepare", "--model", ws["target"], "--conversations", f, "--out", ws["root"] / "data"], ws["root"] / "data"


def c_empty_assistant(ws):
    f = write_jsonl(ws["root"] / "empty.jsonl", [conv(), conv(answer="")])
    return ["prepare", "--model", ws["target"], "--conversations", f, "--out", ws["root"] / "data"], ws["root"] / "data"


def c_all_too_long(ws):
    f = write_jsonl(ws["root"] / "long.jsonl", [conv("x" * 200, "y" * 200)] * 2)
    return (["prepare", "--model", ws["target"], "--conversations", f, "--out", ws["root"] / "data", "--max-length", "50"],
            ws["root"] / "data")


def c_not_utf8(ws):
    f = ws["root"] / "latin1.jsonl"
    f.write_bytes(json.dumps(conv()).encode() + b"\n" + '{"messages": [{"role": "user", "content": "caf'.encode()
                  + b"\xe9" + b'"}]}\n')
    return ["prepare", "--model", ws["target"], "--conversations", f, "--out", ws["root"] / "data"], ws["root"] / "data"


def c_empty_file(ws):
    f = ws["root"] / "nothing.jsonl"
    f.write_text("\n")
    return ["prepare", "--model", ws["target"], "--conversations", f, "--out", ws["root"] / "data"], ws["root"] / "data"


def c_data_is_dir(ws):
    return ["prepare", "--model", ws["target"], "--conversations", ws["root"] / "hidden", "--out", ws["root"] / "d2"], None


def c_no_chat_template(ws):
    return (["prepare", "--model", ws["no_template"], "--conversations", ws["root"] / "good.jsonl", "--out",
             ws["root"] / "data"], ws["root"] / "data")


def c_out_under_file(ws):
    # Tests run as root, where chmod does not stop writes: a path under a regular FILE cannot be created.
    return ["prepare", "--model", ws["target"], "--conversations", ws["root"] / "good.jsonl", "--out",
            ws["root"] / "good.jsonl" / "out"], ws["root"] / "good.jsonl"


def c_out_in_proc(ws):
    return ["capture", "--model", ws["target"], "--prepared", ws["root"] / "data", "--out", "/proc/specdraft-out"], None


def c_model_missing(ws):
    return ["info", "--model", ws["root"] / "no-such-model"], None


def c_layer_out_of_range(ws):
    return (["capture", "--model", ws["target"], "--prepared", ws["root"] / "data", "--out", ws["root"] / "h-range",
             "--layers", "2,4,99"], None)


def c_layers_not_ints(ws):
    return (["capture", "--model", ws["target"], "--prepared", ws["root"] / "data", "--out", ws["root"] / "h-x",
             "--layers", "two,four,six"], None)


def c_capture_other_target(ws):
    return (["capture", "--model", ws["other"], "--prepared", ws["root"] / "data", "--out", ws["root"] / "h-other"],
            ws["root"] / "data")


def c_capture_existing_out(ws):
    return (["capture", "--model", ws["target"], "--prepared", ws["root"] / "data", "--out", ws["root"] / "hidden",
             "--layers", LAYERS], ws["root"] / "hidden")


def c_resume_other_layers(ws):
    return (["capture", "--model", ws["target"], "--prepared", ws["root"] / "data", "--out", ws["root"] / "hidden",
             "--layers", "1,2,3", "--resume", "--store-dtype", "float32", "--shard-tokens", "200"], ws["root"] / "hidden")


def c_capture_nan(ws):
    return (["capture", "--model", ws["nan_target"], "--prepared", ws["root"] / "data-nan", "--out",
             ws["root"] / "h-nan", "--store-dtype", "float32"], ws["root"] / "data-nan")


def c_data_unfinished(ws):
    d = copy(ws, "data", "data-unfinished")
    (d / "prepare.json").unlink()
    return ["capture", "--model", ws["target"], "--prepared", d, "--out", ws["root"] / "h-unf"], d


def c_truncated_shard(ws):
    h = copy(ws, "hidden", "h-trunc")
    shard = h / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    return (["train", "--model", ws["target"], "--store", h, "--vocab", ws["root"] / "vocab.safetensors",
             "--out", ws["root"] / "run-trunc", "--no-progress"], h)


def c_shard_hash(ws):
    h = copy(ws, "hidden", "h-hash")
    shard = h / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    return ["capture", "--out", h, "--verify"], h


def c_manifest_escape(ws):
    h = copy(ws, "hidden", "h-escape")
    m = json.loads((h / "manifest.json").read_text())
    m["shards"][0]["file"] = "../../etc/passwd"
    (h / "manifest.json").write_text(json.dumps(m))
    return ["capture", "--out", h, "--verify"], h


def c_store_incomplete(ws):
    h = copy(ws, "hidden", "h-incomplete")
    m = json.loads((h / "manifest.json").read_text())
    m["complete"] = False
    (h / "manifest.json").write_text(json.dumps(m))
    return (["train", "--model", ws["target"], "--store", h, "--vocab", ws["root"] / "vocab.safetensors",
             "--out", ws["root"] / "run-inc", "--no-progress"], h)


def c_store_is_file(ws):
    return (["train", "--model", ws["target"], "--store", ws["root"] / "good.jsonl", "--vocab",
             ws["root"] / "vocab.safetensors", "--out", ws["root"] / "run-file", "--no-progress"], None)


def c_train_other_target(ws):
    return (["train", "--model", ws["other"], "--store", ws["root"] / "hidden", "--vocab",
             ws["root"] / "vocab.safetensors", "--out", ws["root"] / "run-other", "--no-progress"],
            ws["root"] / "hidden")


def c_vocab_other_size(ws):
    from specdraft import vocab as vocab_mod
    v = vocab_mod.load(ws["root"] / "vocab.safetensors")
    bigger = torch.zeros(v.target_vocab_size + 5, dtype=torch.bool)
    bigger[: v.target_vocab_size] = v.t2d
    path = ws["root"] / "vocab-big.safetensors"
    vocab_mod.save(vocab_mod.Vocab(v.d2t.clone(), bigger, {}), path)
    return (["train", "--model", ws["target"], "--store", ws["root"] / "hidden", "--vocab", path,
             "--out", ws["root"] / "run-vocab", "--no-progress"], ws["root"] / "hidden")


def c_resume_nothing(ws):
    return (["train", "--model", ws["target"], "--store", ws["root"] / "hidden", "--vocab",
             ws["root"] / "vocab.safetensors", "--out", ws["root"] / "run-none", "--resume", "--no-progress"], None)


def c_vocab_too_big(ws):
    return (["vocab", "build", "--prepared", ws["root"] / "data", "--size", "100000", "--out",
             ws["root"] / "vocab.safetensors"], ws["root"] / "vocab.safetensors")


def c_d2t_absolute(ws):
    from safetensors.torch import load_file, save_file
    d = copy(ws, "drafter", "drafter-absolute")
    t = load_file(str(d / "model.safetensors"))
    t["d2t"] = t["d2t"] + torch.arange(t["d2t"].numel())      # target ids instead of offsets
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    return ["vocab", "diff", d, ws["root"] / "vocab.safetensors"], d


def c_config_missing_keys(ws):
    d = copy(ws, "drafter", "drafter-nokeys")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["transformer_layer_config"]
    (d / "config.json").write_text(json.dumps(cfg))
    out = copy(ws, "drafter", "import-existing")
    return ["import", d, "--out", out], out


def c_unknown_layout(ws):
    d = copy(ws, "drafter", "drafter-foreign")
    (d / "config.json").write_text(json.dumps({"architectures": ["MedusaModel"], "hidden_size": 64}))
    return ["export", d, "--out", ws["root"] / "export-x"], d


def c_config_not_json(ws):
    d = copy(ws, "drafter", "drafter-badjson")
    (d / "config.json").write_text("{ this is not json")
    return ["import", d, "--out", ws["root"] / "import-y"], d


def c_export_format(ws):
    return ["export", ws["root"] / "drafter", "--format", "onnx", "--out", ws["root"] / "export-onnx"], \
        ws["root"] / "drafter"


def c_bench_no_prompts(ws):
    f = write_jsonl(ws["root"] / "noprompts.jsonl", [{"messages": [{"role": "system", "content": "be brief"}]}])
    return ["bench", "--model", ws["target"], "--prompts", f, "--methods", "greedy"], None


def c_bench_prompts_dir(ws):
    return ["bench", "--model", ws["target"], "--prompts", ws["root"] / "hidden", "--methods", "greedy"], None


def nan_store(ws) -> Path:
    """A copy of the store whose shard 0 holds NaN aux states (manifest hash updated, so only the
    values are wrong: what a target that overflowed in bf16 would have left behind)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from specdraft.io import sha256_file

    h = ws["root"] / "h-nan-store"
    if h.exists():
        return h
    h = copy(ws, "hidden", "h-nan-store")
    shard = h / "shard-00000.safetensors"
    with safe_open(str(shard), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    tensors["aux"][:] = float("nan")
    save_file(tensors, str(shard), metadata=meta)
    m = json.loads((h / "manifest.json").read_text())
    m["shards"][0]["sha256"] = sha256_file(shard)
    (h / "manifest.json").write_text(json.dumps(m))
    return h


def c_train_nan_store(ws):
    h = nan_store(ws)
    return (["train", "--model", ws["target"], "--store", h, "--vocab", ws["root"] / "vocab.safetensors",
             "--out", ws["root"] / "run-nan", "--no-progress", "--val-fraction", "0", "--max-tokens", "64",
             "--precision", "fp32"], h)


def c_eval_store_other_target(ws):
    return ["eval", "--drafter", ws["root"] / "drafter", "--store", ws["root"] / "hidden", "--model", ws["other"]], \
        ws["root"] / "drafter"


def c_generate_k0(ws):
    return ["generate", "--model", ws["target"], "--prompt", "hi", "--method", "ngram", "-k", "0"], None


def c_foreign_flag(ws):   # SpecForge's name for --out: one line naming ours
    return ["train", "--output-dir", ws["root"] / "run-x"], None


def c_store_as_prepared(ws):
    return ["capture", "--model", ws["target"], "--prepared", ws["root"] / "hidden", "--out", ws["root"] / "h-s"], \
        ws["root"] / "hidden"


def c_prepared_as_store(ws):
    return (["train", "--model", ws["target"], "--store", ws["root"] / "data", "--vocab",
             ws["root"] / "vocab.safetensors", "--out", ws["root"] / "run-p", "--no-progress"], ws["root"] / "data")


def c_store_as_prepared_vocab(ws):
    return ["vocab", "build", "--prepared", ws["root"] / "hidden", "--size", "16", "--out", ws["root"] / "v-s.st"], \
        ws["root"] / "hidden"


def c_prepared_as_store_eval(ws):
    return ["eval", "--drafter", ws["root"] / "drafter", "--store", ws["root"] / "data", "--model", ws["target"]], \
        ws["root"] / "data"


def c_removed_old_name(ws):   # the deprecated aliases are gone (issue 28): one line with the new name
    return ["vocab", "build", "--data", ws["root"] / "data", "--size", "16",
            "--out", ws["root"] / "v-both.st"], ws["root"] / "data"


def c_disk_full(ws):
    return (["capture", "--model", ws["target"], "--prepared", ws["root"] / "data", "--out", ws["root"] / "h-disk",
             "--layers", LAYERS], ws["root"] / "data")


# ----------------------------------------------------------------------------- numbers, types, paths (issue 14)


def c_lr_nan(ws):
    return (["train", "--model", ws["target"], "--store", ws["root"] / "hidden", "--vocab",
             ws["root"] / "vocab.safetensors", "--out", ws["root"] / "run-lrnan", "--lr", "nan", "--no-progress"], None)


def c_yaml_wrong_type(ws):
    f = ws["root"] / "run.yaml"
    f.write_text("epochs: three\nlr: 0.001\n")
    return (["train", "--config", f, "--model", ws["target"], "--store", ws["root"] / "hidden", "--vocab",
             ws["root"] / "vocab.safetensors", "--out", ws["root"] / "run-yaml", "--no-progress"], None)


def c_yaml_bool_as_int(ws):
    f = ws["root"] / "run-bool.yaml"
    f.write_text("progress: 'no'\nmax_tokens: 64\nval_fraction: 0\nprecision: fp32\n")   # a string, always true
    return (["train", "--config", f, "--model", ws["target"], "--store", ws["root"] / "hidden", "--vocab",
             ws["root"] / "vocab.safetensors", "--out", ws["root"] / "run-yaml2"], None)


def c_config_is_list(ws):
    d = copy(ws, "drafter", "drafter-list")
    (d / "config.json").write_text("[1, 2, 3]")
    return ["import", d, "--out", ws["root"] / "import-list"], d


def c_vocab_zero_rows(ws):
    from safetensors.torch import save_file
    path = ws["root"] / "vocab-empty.safetensors"
    save_file({"d2t": torch.zeros(0, dtype=torch.long), "t2d": torch.zeros(263, dtype=torch.bool)}, str(path))
    return (["train", "--model", ws["target"], "--store", ws["root"] / "hidden", "--vocab", path,
             "--out", ws["root"] / "run-vocab0", "--no-progress"], path)


def c_untrained_zero(ws):
    return ["generate", "--model", ws["target"], "--prompt", "hi", "--drafter", "untrained:0",
            "--max-new-tokens", "4"], None


def c_json_is_dir(ws):
    return ["bench", "--model", ws["target"], "--prompts", ws["root"] / "good.jsonl", "--methods", "greedy",
            "--max-new-tokens", "2", "--limit", "1", "--out", ws["root"] / "hidden"], ws["root"] / "hidden"


def c_eval_json_is_dir(ws):
    return ["eval", "--drafter", ws["root"] / "drafter", "--store", ws["root"] / "hidden", "--model", ws["target"],
            "--split", "all", "--out", ws["root"] / "hidden"], ws["root"] / "hidden"


def c_vocab_out_is_dir(ws):
    return ["vocab", "build", "--prepared", ws["root"] / "data", "--size", "32", "--out", ws["root"] / "hidden"], \
        ws["root"] / "hidden"


def c_metrics_wrong_types(ws):
    run = ws["root"] / "run-badmetrics"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text(json.dumps({"split": "val", "step": "ten", "tokens_seen": None,
                                                   "metrics": {"loss": "low"}}) + "\n")
    return ["compare", run], run


def c_metrics_metric_not_number(ws):
    run = ws["root"] / "run-badmetrics2"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text(json.dumps({"split": "val", "step": 3, "epoch": 0, "tokens_seen": 100,
                                                   "metrics": {"loss": "low"}}) + "\n")
    return ["compare", run], run


def c_export_tokens_negative(ws):
    return ["export", ws["root"] / "drafter", "--out", ws["root"] / "export-neg", "--num-speculative-tokens", "-2"], \
        ws["root"] / "drafter"


def c_generate_negative_tokens(ws):
    return ["generate", "--model", ws["target"], "--prompt", "hi", "--method", "greedy", "--max-new-tokens", "-3"], None


def c_remap_other_tokenizer(ws):
    from specdraft import vocab as vocab_mod
    v = vocab_mod.load(ws["root"] / "vocab.safetensors")
    assert v.meta.get("tokenizer"), "vocab build records the tokenizer"
    path = ws["root"] / "vocab-othertok.safetensors"
    vocab_mod.save(vocab_mod.Vocab(v.d2t.clone(), v.t2d.clone(), {**v.meta, "tokenizer": "0123456789abcdef"}), path)
    return ["vocab", "remap", ws["root"] / "vocab.safetensors", path, "--out", ws["root"] / "remap.safetensors"], None


def c_engine_args_model(ws):
    return (["capture", "--model", ws["target"], "--prepared", ws["root"] / "data", "--out", ws["root"] / "h-ea",
             "--engine", "vllm", "--engine-args", json.dumps({"model": ws["other"], "max_model_len": 512})],
            ws["root"] / "data")


def c_engine_args_dtype_prepare(ws):
    return (["prepare", "--model", ws["target"], "--conversations", ws["root"] / "good.jsonl", "--out",
             ws["root"] / "d-ea", "--regenerate", "--engine", "vllm", "--engine-args",
             '{"dtype": "float16", "tokenizer": "gpt2"}'], None)


def c_engine_args_extraction_train(ws):
    return (["train", "--online", "--prepared", ws["root"] / "data", "--model", ws["target"], "--vocab",
             ws["root"] / "vocab.safetensors", "--out", ws["root"] / "run-ea", "--engine", "vllm", "--engine-args",
             '{"speculative_config": {"method": "ngram"}}'], None)


def c_bench_null_content(ws):
    f = write_jsonl(ws["root"] / "nullprompt.jsonl", [{"prompt": "fine"}, {"messages": [{"role": "user", "content": None}]}])
    return ["bench", "--model", ws["target"], "--prompts", f, "--methods", "greedy"], None


def c_bench_number_content(ws):
    f = write_jsonl(ws["root"] / "numprompt.jsonl", [{"messages": [{"role": "user", "content": 42}]}])
    return ["bench", "--model", ws["target"], "--prompts", f, "--methods", "greedy"], None


def c_bench_prompts_not_utf8(ws):
    f = ws["root"] / "latin1-prompts.jsonl"
    f.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    return ["bench", "--model", ws["target"], "--prompts", f, "--methods", "greedy"], None


def c_prepare_null_user(ws):
    f = write_jsonl(ws["root"] / "nulluser.jsonl", [conv(), {"messages": [{"role": "user", "content": None},
                                                                         {"role": "assistant", "content": "x"}]}])
    return ["prepare", "--model", ws["target"], "--conversations", f, "--out", ws["root"] / "data"], ws["root"] / "data"


MATRIX = [
    Case("jsonl line that is not JSON", c_not_json, "line 2: not valid JSON"),
    Case("unknown role", c_unknown_role, "unknown role 'wizard'"),
    Case("empty assistant turn", c_empty_assistant, "empty assistant turn"),
    Case("every conversation over --max-length", c_all_too_long, "no samples left after filtering"),
    Case("non-UTF-8 bytes", c_not_utf8, "line 2: not UTF-8"),
    Case("data file with no conversations", c_empty_file, "no conversations found"),
    Case("directory where a data file is expected", c_data_is_dir, "is a directory"),
    Case("model without a chat template", c_no_chat_template, "chat template"),
    Case("--out under a regular file (unwritable)", c_out_under_file, "cannot create output folder"),
    Case("--out in /proc (unwritable)", c_out_in_proc, "cannot create output folder"),
    Case("model folder that does not exist", c_model_missing, "no-such-model"),
    Case("aux layer id out of range", c_layer_out_of_range, "aux layer id 99 out of range"),
    Case("--layers not integers", c_layers_not_ints, "expected comma-separated integers"),
    Case("prepared data from another target", c_capture_other_target, "prepared for"),
    Case("capture into a finished store without --resume", c_capture_existing_out, "pass --resume"),
    Case("--resume with other layers than the store", c_resume_other_layers, "layer_ids"),
    Case("NaN in hidden states (capture)", c_capture_nan, "non-finite hidden states", after_start=True),
    Case("prepared folder without prepare.json", c_data_unfinished, "prepare did not finish"),
    Case("truncated safetensors shard", c_truncated_shard, "corrupt or truncated shard"),
    Case("shard whose sha256 does not match", c_shard_hash, "sha256 mismatch in shard-00001"),
    Case("manifest path escaping the store", c_manifest_escape, "points outside the store"),
    Case("store whose capture did not finish", c_store_incomplete, "capture did not finish"),
    Case("regular file where a store folder is expected", c_store_is_file, "hidden-state store not found"),
    Case("store captured from another target (train)", c_train_other_target, "target fingerprint"),
    Case("vocab for a larger target vocabulary", c_vocab_other_size, "vocab size"),
    Case("train --resume without a checkpoint", c_resume_nothing, "no checkpoint to resume from"),
    Case("draft vocab larger than the target's", c_vocab_too_big, "larger than the target vocabulary"),
    Case("d2t in absolute ids instead of offsets", c_d2t_absolute, "d2t"),
    Case("drafter config.json missing keys", c_config_missing_keys, "transformer_layer_config"),
    Case("unknown checkpoint layout", c_unknown_layout, "unknown checkpoint layout"),
    Case("drafter config.json not JSON", c_config_not_json, "not valid JSON"),
    Case("unknown export format", c_export_format, "--format onnx"),
    Case("prompts file with no prompts (bench)", c_bench_no_prompts, "no prompts"),
    Case("directory where a prompts file is expected", c_bench_prompts_dir, "is a directory"),
    Case("NaN in a store's hidden states (train)", c_train_nan_store, "loss is nan", after_start=True),
    Case("drafter/store for another target (eval)", c_eval_store_other_target, "fingerprint"),
    Case("-k 0", c_generate_k0, "--num-speculative-tokens 0"),
    Case("a neighbouring tool's flag name", c_foreign_flag, "No such option: --output-dir"),
    Case("store where prepared data is expected (capture)", c_store_as_prepared, "a hidden-state store"),
    Case("store where prepared data is expected (vocab build)", c_store_as_prepared_vocab, "a hidden-state store"),
    Case("prepared data where a store is expected (train)", c_prepared_as_store, "not a hidden-state store"),
    Case("prepared data where a store is expected (eval)", c_prepared_as_store_eval, "not a hidden-state store"),
    Case("a removed old option name", c_removed_old_name, "--prepared"),
    Case("--lr nan", c_lr_nan, "--lr nan"),
    Case("wrongly typed value in --config YAML", c_yaml_wrong_type, "epochs"),
    Case("string where a switch is expected in --config YAML", c_yaml_bool_as_int, "progress"),
    Case("drafter config.json that is a JSON list", c_config_is_list, "JSON object"),
    Case("vocab with 0 rows", c_vocab_zero_rows, "0 rows"),
    Case("--drafter untrained:0", c_untrained_zero, "untrained:0"),
    Case("--out naming an existing directory (bench)", c_json_is_dir, "is a directory"),
    Case("--out naming an existing directory (eval)", c_eval_json_is_dir, "is a directory"),
    Case("--out naming an existing directory (vocab build)", c_vocab_out_is_dir, "is a directory"),
    Case("metrics.jsonl line with wrongly typed fields", c_metrics_wrong_types, "step"),
    Case("metrics.jsonl metric that is not a number", c_metrics_metric_not_number, "loss"),
    Case("--num-speculative-tokens -2 (export)", c_export_tokens_negative, "--num-speculative-tokens -2"),
    Case("--max-new-tokens -3 (generate)", c_generate_negative_tokens, "--max-new-tokens -3"),
    Case("vocab remap between different tokenizers", c_remap_other_tokenizer, "tokenizer"),
    Case("prompts line with null content (bench)", c_bench_null_content, "nullprompt.jsonl:2: user content is null"),
    Case("prompts line with a number as content (bench)", c_bench_number_content, "numprompt.jsonl:1: user content is 42"),
    Case("prompts file not UTF-8 (bench)", c_bench_prompts_not_utf8, "latin1-prompts.jsonl:2: not UTF-8"),
    Case("user turn with null content (prepare)", c_prepare_null_user, "user content is null"),
    Case("--engine-args overriding the model (capture)", c_engine_args_model, "'model' may not be set here"),
    Case("--engine-args overriding dtype and tokenizer (prepare)", c_engine_args_dtype_prepare,
         "'dtype', 'tokenizer' may not be set here"),
    Case("--engine-args overriding the hidden-state extraction (train --online)", c_engine_args_extraction_train,
         "'speculative_config' may not be set here"),
]


@pytest.mark.parametrize("case", MATRIX, ids=[c.name for c in MATRIX])
def test_bad_input_exits_2_with_one_line(case, ws, monkeypatch, capsys):
    line = check_refusal(ws, monkeypatch, capsys, case.build, case.phrase, case.after_start)
    print(f"\n{case.name}\t{line}")


def test_disk_space_preflight_names_the_numbers(ws, monkeypatch, capsys):
    """Capture checks free space before writing anything and says how much it needs."""
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 2000, 2000))
    line = check_refusal(ws, monkeypatch, capsys, c_disk_full, "not enough disk space")
    assert "tokens x 4 x 64 x 2 B needs" in line and "but only 2.00 KB is free" in line, line
    assert not list((ws["root"] / "h-disk").glob("shard-*"))
    assert not (ws["root"] / "h-disk" / "manifest.json").exists()


def test_matrix_is_big_enough():
    assert len(MATRIX) >= 25


def test_vocab_records_the_tokenizer_so_remap_tells_siblings_from_strangers(ws, tmp_path):
    """A sibling target (same tokenizer, other weights) remaps; one more token makes another tokenizer."""
    from specdraft import vocab as vocab_mod
    from specdraft.targets import load_tokenizer

    vocab_mod.build_from_data(ws["root"] / "data", 16, tmp_path / "sibling.safetensors", model=ws["other"])
    a, b = vocab_mod.load(ws["root"] / "vocab.safetensors"), vocab_mod.load(tmp_path / "sibling.safetensors")
    assert a.meta["tokenizer"] == b.meta["tokenizer"]
    assert vocab_mod.remap(a, b).carried == 16
    tok = load_tokenizer(ws["target"])
    before = vocab_mod.tokenizer_fingerprint(tok)
    tok.add_tokens(["<new-token>"])
    assert vocab_mod.tokenizer_fingerprint(tok) != before
