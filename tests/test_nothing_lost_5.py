"""Nothing lost, round 5 (issue 57): settings a method does not use are refused or recorded as unused, and no
command's --out lands on another command's result in a run folder."""

from __future__ import annotations

import sys

import pytest

from specdraft.errors import SpecdraftError
from specdraft.infer import methods


def test_k_with_tree_methods_only_is_refused_before_any_load():
    """-k was recorded in bench.json as the K of a bench that ran only trees (whose size is --tree's)."""
    with pytest.raises(SpecdraftError, match="-k 3: no method in --methods eagle3-tree,greedy drafts a chain"):
        methods.check_bench_options(["eagle3-tree", "greedy"], "eagle3-tree,greedy", [], 3, 3, None, None, "float32")
    methods.check_bench_options(["eagle3-tree", "ngram"], "eagle3-tree,ngram", [], 3, 3, None, None, "float32")


def test_hybrid_as_the_switch_is_never_recorded_as_reading_the_datastore():
    """generate/bench --method hybrid --datastore on a machine where hybrid runs as the switch: the switch drafts
    from the context alone, so the datastore is said unused and recorded with the methods that read it."""
    assert methods.datastore_readers(["plain", "ngram", "hybrid"], "switch") == ["ngram"]
    assert methods.datastore_readers(["hybrid"], "tree") == ["hybrid"] and methods.datastore_readers(["hybrid-tree"], None) == \
        ["hybrid-tree"]
    assert "the datastore is unused" in methods.unused_datastore_line(["hybrid"], "switch")
    assert methods.unused_datastore_line(["hybrid", "ngram"], "switch") is None     # n-gram reads it
    assert methods.unused_datastore_line(["hybrid"], "tree") is None


def run_cli(monkeypatch, capsys, *args) -> tuple[int, str]:
    from specdraft import cli

    monkeypatch.setattr(sys, "argv", ["specdraft", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        cli.main()
    return e.value.code or 0, capsys.readouterr().err


@pytest.mark.parametrize("command, name", [("bench", "eval.json"), ("eval", "bench.json"), ("plan", "eval.json"),
                                           ("plan", "bench_vllm.json")])
def test_an_out_on_another_commands_result_in_a_run_is_refused(tmp_path, monkeypatch, capsys, command, name):
    """`bench --out RUN/eval.json` replaced eval's result with a bench report, and `report` ran without eval's τ."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    (run / "eval.json").write_text('{"accept_len": 2.0}')
    args = {"bench": ["--model", "default"], "eval": ["--drafter", run, "--store", tmp_path / "nostore"],
            "plan": ["--accept", "0.5,0.3"]}[command]
    code, err = run_cli(monkeypatch, capsys, command, *args, "--out", run / name)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"--out {run / name}: is `specdraft " in err and f"write {command}'s elsewhere" in err
    assert (run / "eval.json").read_text() == '{"accept_len": 2.0}'               # nothing already written lost
    own = tmp_path / "elsewhere.json"                                              # the same name outside a run: fine
    from specdraft.run_layout import foreign_result
    assert foreign_result(own, command) is None and foreign_result(run / "bench.json", "bench") is None


def test_a_recipe_extra_source_that_is_no_file_fails_before_any_stage(tmp_path):
    """A recipe with `extra: nosuch.jsonl:5` passed the up-front check and failed minutes later at its stage."""
    from specdraft.pipeline import load_recipe

    path = tmp_path / "r.yaml"
    base = "epochs: 1\nrecipe: {samples: 6, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64, extra: '%s'}\n"
    path.write_text(base % "nosuch.jsonl:5")
    with pytest.raises(SpecdraftError, match="extra is 'nosuch.jsonl:5'; nosuch.jsonl is not a file"):
        load_recipe(path)
    data = tmp_path / "extra.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    path.write_text(base % f"{data}:5")
    assert load_recipe(path).extra == f"{data}:5"
    path.write_text(base % "pydoc:800")
    assert load_recipe(path).extra == "pydoc:800"


def test_datastore_token_ids_past_the_vocabulary_never_reach_a_forward(tmp_path):
    """A datastore whose answers hold an id outside the target's vocabulary (data of another tokenizer without a
    fingerprint, or a hand-edited file) drafted that id into the verify forward; it is refused in one line."""
    from types import SimpleNamespace

    from specdraft.data.prepared import save_prepared
    from specdraft.infer.ngram import Datastore

    rows = {"input_ids": [[1, 2, 3, 4, 999]], "loss_mask": [[0, 1, 1, 1, 1]], "messages": ["[]"]}
    save_prepared(tmp_path / "data", rows, {"source": "test"})
    target = SimpleNamespace(vocab_size=100, name="tiny", identity={"fingerprint": "x"})
    with pytest.raises(SpecdraftError, match=r"answer 0 holds token id 999, outside tiny's vocabulary \(0..99\)"):
        Datastore.from_prepared(tmp_path / "data", target)
    assert Datastore.from_prepared(tmp_path / "data", SimpleNamespace(**{**vars(target), "vocab_size": 1000})).answers \
        == [[2, 3, 4, 999]]


def test_an_empty_answer_is_dropped_and_counted_never_trained(tiny_target, tmp_path):
    """`prepare --conversations long --limit 4 --max-length 8192` kept a sample whose regenerated answer was ''
    (the target ended its turn at once): only the end of turn was trained. Empty answers are dropped and counted."""
    from specdraft.data.conversations import Conversation
    from specdraft.data.prepare import render_and_filter
    from specdraft.infer.prompts import target_chat
    from specdraft.targets import load_target

    chat = target_chat(load_target(str(tiny_target)), {})
    end = sorted(chat.end_ids)[0]
    convs = []
    for i, body in enumerate(["an answer", "", "more"]):
        prompt = chat.prompt_ids([{"role": "user", "content": f"q{i}"}])
        answer = chat.answer(prompt, chat.tokenizer(body, add_special_tokens=False)["input_ids"] + [end], False)
        convs.append(Conversation(messages=[{"role": "user", "content": f"q{i}"}, answer.message], where=f"c{i}"))
    dropped = {"duplicate": 0, "too_long": 0, "too_few_assistant_tokens": 0, "empty_answer": 0, "over_limit": 0}
    rows, _ = render_and_filter(chat, convs, 4096, 1, True, None, dropped)
    assert len(rows["input_ids"]) == 2 and dropped["empty_answer"] == 1


def test_max_length_past_the_targets_context_is_refused(tiny_target, tmp_path):
    import json

    from specdraft.data.prepare import prepare

    context = json.loads((tiny_target / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(SpecdraftError, match=f"--max-length {context + 1}: past .*context of {context} tokens"):
        prepare(str(tiny_target), "builtin", tmp_path / "out", limit=2, max_length=context + 1, regenerate=True)
    assert not (tmp_path / "out" / "prepare.json").exists()


@pytest.mark.parametrize("damaged", [{"float32": 1.0, "bfloat16": 0}, {"float32": 1.0, "bfloat16": -5.0},
                                     {"float32": True, "bfloat16": 0.5}, {"float32": "1", "bfloat16": 0.5}])
def test_a_damaged_dtype_cache_is_measured_again(tmp_path, monkeypatch, damaged):
    """The per-machine dtype choice trusted a cache holding 0 or negative ms (bf16 "faster" for free), where its
    code says a damaged cache is measured again; so does the kernel table for a 0 ms entry."""
    import json

    import torch

    from specdraft import dtypes, kernels

    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "_TABLES", {})
    shapes, calls = {(24, 40): 2}, []

    def timer(shape, rows, dtype):
        calls.append(dtype)
        return 1.0 if dtype == torch.float32 else 2.0          # bf16 slower: float32 is the honest choice
    assert dtypes.faster_dtype(shapes, 4, timer=timer)[0] == "float32"   # measured: the cache file is written
    path = next((tmp_path / "cache" / "kernels").glob("dtype-*.json"))
    path.write_text(json.dumps({"ms": damaged}))
    calls.clear()
    monkeypatch.setattr(dtypes, "time_paths", lambda shape, n, dtype, paths=None: {"linear": timer(shape, n, dtype)})
    assert dtypes.faster_dtype(shapes, 4)[0] == "float32" and calls          # measured again, not trusted
    assert kernels.usable_timings({"24x40": {"2": {"linear": 0, "mm": 1.0}}}) == {}


@pytest.mark.parametrize("field, value", [("num_attention_heads", 0), ("draft_vocab_size", -1), ("num_key_value_heads", 0)])
def test_a_drafter_config_size_below_its_minimum_is_one_line(tmp_path, field, value):
    """Round 4's leftover: a family config value of 0 exported a negative speculative_tokens. Every size of a
    drafter config is checked when a checkpoint is read, by every command that reads one."""
    import json

    from specdraft.formats.checkpoints import load_checkpoint, save_drafter
    from specdraft.model.eagle3.config import DrafterConfig
    from specdraft.model.eagle3.module import Eagle3Drafter

    cfg = DrafterConfig(hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=4, vocab_size=50, draft_vocab_size=10, aux_layer_ids=[1, 2, 3])
    drafter = Eagle3Drafter(cfg)
    drafter.t2d[:10] = True                                  # draft ids 0..9 are target ids 0..9 (d2t offsets 0)
    save_drafter(drafter, tmp_path / "d")
    load_checkpoint(tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["specdraft"]["drafter_config"][field] = value
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecdraftError, match=f"config.json: {field} is {value!r}; a eagle3 drafter needs a whole "
                                             "number >= 1"):
        load_checkpoint(tmp_path / "d")


def test_a_typod_run_path_is_never_made_silently(tmp_path, monkeypatch, capsys):
    """Round 4's leftover: `plan --run TYPO` made the folder, wrote plan.json and a journal there, exit 0. --run
    must exist; `journal add` (a journal may come before training) makes it, and says so."""
    typo = tmp_path / "runs" / "qiuck"
    (tmp_path / "runs").mkdir()
    code, err = run_cli(monkeypatch, capsys, "plan", "--run", typo, "--accept", "0.5,0.3", "--draft-ms", "5",
                        "--verify-ms", "10,11,12")
    assert code == 2 and f"--run {typo}: no such run folder" in err and not typo.exists()
    code, err = run_cli(monkeypatch, capsys, "journal", "add", typo, "a note", "--kind", "result")
    assert code == 0 and f"note: {typo} did not exist: made it" in err and (typo / "journal.md").is_file()
    code, err = run_cli(monkeypatch, capsys, "journal", "add", typo, "another", "--kind", "result")
    assert code == 0 and "did not exist" not in err


def test_export_refuses_a_model_it_would_not_read(tmp_path, monkeypatch, capsys):
    """Round 4's leftover: `export --model M` without --no-embeddings accepted M and ignored it."""
    code, err = run_cli(monkeypatch, capsys, "export", tmp_path / "nosuch", "--out", tmp_path / "e", "--model",
                        "default")
    assert code == 2 and "--model default: export reads it only to check --no-embeddings" in err
    assert not (tmp_path / "e").exists()


PREPARE_EDITS = [("target", "x", "field 'target' is \"x\""), ("part", 5, "field 'part' is 5"),
                 ("part", [3, 2], "must be [index, count]"), ("chat_template_kwargs", [1], "'chat_template_kwargs'"),
                 ("target.fingerprint", 5, "field 'target.fingerprint' is 5"), ("limit", "8", "field 'limit'")]


@pytest.mark.parametrize("field, value, expected", PREPARE_EDITS)
def test_a_prepare_record_of_wrong_types_is_one_line_in_every_reader(tmp_path, field, value, expected):
    """prepare.json's `target: "x"` or `part: 5` ended capture and vocab build in a traceback; `part: [3, 2]` and a
    list of template arguments were accepted. Every reader (capture, train, vocab, the datastore, eval, doctor, the
    recipe) goes through one schema."""
    import json

    from specdraft.data import prepared as P
    from test_capture import make_prepared

    folder = make_prepared(tmp_path / "data", {"id": "t", "fingerprint": "f" * 32})
    meta = json.loads((folder / P.META).read_text())
    head, _, leaf = field.partition(".")
    (meta[head].__setitem__(leaf, value) if leaf else meta.__setitem__(head, value))
    (folder / P.META).write_text(json.dumps(meta))
    before = (folder / P.META).read_text()
    with pytest.raises(SpecdraftError, match="prepare.json: ") as e:
        P.load_prepared(folder)
    assert expected in str(e.value) and "re-run `specdraft prepare" in str(e.value)
    with pytest.raises(SpecdraftError, match="prepare.json: "):              # eval's and doctor's reader
        P.prepared_meta_of({"data": {"path": str(folder)}})
    assert (folder / P.META).read_text() == before                            # nothing written


def test_a_garbage_or_mistyped_dataset_is_one_line(tmp_path, monkeypatch, capsys):
    """A damaged arrow file ended `vocab build` in pyarrow's OSError traceback; input_ids held as strings were cast
    to numbers and trained."""
    import datasets

    from specdraft.data import prepared as P
    from test_capture import make_prepared

    folder = make_prepared(tmp_path / "data", None)
    arrow = next((folder / P.DATASET).glob("*.arrow"))
    arrow.write_bytes(b"\xff" * 300)
    capsys.readouterr()                                          # the save's progress bar
    code, err = run_cli(monkeypatch, capsys, "vocab", "build", "--prepared", folder, "--size", 8,
                        "--out", tmp_path / "v.safetensors")
    assert code == 2 and "unreadable dataset" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    strings = make_prepared(tmp_path / "strings", None)
    ds = datasets.load_from_disk(str(strings / P.DATASET)).to_dict()
    ds["input_ids"] = [[str(t) for t in row] for row in ds["input_ids"]]
    datasets.Dataset.from_dict(ds).save_to_disk(str(tmp_path / "swap"))
    import shutil
    shutil.rmtree(strings / P.DATASET)
    (tmp_path / "swap").rename(strings / P.DATASET)
    with pytest.raises(SpecdraftError, match=r"column 'input_ids' holds List\(Value\('string'\)\), expected lists of "
                                             "token integers"):
        P.load_prepared(strings)


@pytest.mark.parametrize("part", [[1, 2, 3], "1/2", [3, 2], [0, 2]])
def test_a_manifest_part_that_is_not_index_of_count_is_refused(tmp_path, part):
    """Round 4's leftover: a manifest whose `part` was a list of three (or a string) trained, its samples put in an
    order of nobody's capture."""
    import json

    from specdraft.data import store as st

    root = tmp_path / "store"
    root.mkdir()
    manifest = {"format": st.FORMAT, "format_version": st.FORMAT_VERSION, "target": {"fingerprint": "f"}, "layer_ids": [1], "dtype": "float32", "hidden_size": 4,
                "num_samples": 0, "num_tokens": 0, "complete": True, "shards": [], "part": part}
    (root / st.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(SpecdraftError, match="field 'part' must be \\[index, count\\]"):
        st.read_manifest(root)
    manifest["part"] = [2, 2]
    (root / st.MANIFEST).write_text(json.dumps(manifest))
    assert st.read_manifest(root)["part"] == [2, 2]


def test_finished_data_of_another_max_length_is_never_reused_by_a_recipe(tmp_path):
    """A workspace prepared with `max_tokens: 8192` (prepare --max-length 8192) was reused when the recipe went back
    to 2048-token rows (and the other way round): prepare's max length was in no check of the finished stages."""
    import json

    from specdraft import pipeline
    from specdraft.pipeline import load_recipe

    ws, path = tmp_path / "ws", tmp_path / "r.yaml"
    (ws / "data").mkdir(parents=True)
    base = "recipe: {samples: 64, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64}\n"
    record = {"source": "builtin", "limit": 64, "regeneration": {"max_new_tokens": 12}, "max_length": 8192}
    (ws / "data" / "prepare.json").write_text(json.dumps(record))
    path.write_text("epochs: 1\n" + base)
    with pytest.raises(SpecdraftError, match=r"field 'max_length' is 8192, but this recipe asks for null.*set recipe "
                                             r"max_tokens: 8192"):
        pipeline.check_finished_stages(ws, load_recipe(path), "builtin")
    path.write_text("epochs: 1\nmax_tokens: 8192\n" + base)
    pipeline.check_finished_stages(ws, load_recipe(path), "builtin")
    record.update(max_length=4096, defaults_by_thinking_mode={"max_length": 4096})   # prepare's own thinking default
    (ws / "data" / "prepare.json").write_text(json.dumps(record))
    with pytest.raises(SpecdraftError, match=r"field 'max_length' is null, but this recipe asks for 8192"):
        pipeline.check_finished_stages(ws, load_recipe(path), "builtin")
    path.write_text("epochs: 1\n" + base)
    pipeline.check_finished_stages(ws, load_recipe(path), "builtin")


def test_questions_written_in_another_dtype_are_never_reused(tmp_path):
    """self:N questions and follow-ups were keyed by target, seed and template only: a re-run whose target computes
    in bfloat16 reused the questions float32 wrote (the answers, keyed by dtype, were redone around them)."""
    import torch

    from specdraft.data import self_prompts as sp

    class Chat:
        kwargs = {}

    class Target:
        identity = {"fingerprint": "f"}
        model = torch.nn.Linear(2, 2)

    fp32 = sp.written_by(Target, Chat)
    assert fp32 == {"target": "f"}                        # the keys of float32 runs are the ones written before
    Target.model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    assert sp.written_by(Target, Chat) == {"target": "f", "compute_dtype": "bfloat16"} != fp32


def test_replay_checks_its_answers_datastore_and_bench_by_fingerprint(tmp_path, tiny_target, capsys):
    """benchmarks/replay.py replayed another model's answers, drafted from another model's datastore and compared
    with a bench of another target or K, all in silence: identities go by fingerprint there too."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import replay

    from specdraft.targets import load_target
    from test_capture import make_prepared

    target = load_target(str(tiny_target))
    own = make_prepared(tmp_path / "own", target.identity)
    other = make_prepared(tmp_path / "other", {**target.identity, "fingerprint": "0" * 32})
    bench = tmp_path / "bench.json"
    args = SimpleNamespace(natural=other, check=None, k=3, max_new_tokens=128)
    with pytest.raises(SystemExit) as e:
        replay.check_inputs(args, target)
    assert e.value.code == 2 and "--natural " in capsys.readouterr().err
    args.natural = own
    replay.check_inputs(args, target)
    for config, expected in (({"target_fingerprint": "0" * 32, "k": 3, "max_new_tokens": 128}, "a bench of"),
                             ({"target_fingerprint": target.identity["fingerprint"], "k": 2, "max_new_tokens": 128},
                              "field 'config.k' is 2 but this replay runs 3")):
        bench.write_text(json.dumps({"config": config}))
        args.check = bench
        with pytest.raises(SystemExit):
            replay.check_inputs(args, target)
        assert expected in capsys.readouterr().err
    bench.write_text(json.dumps({"config": {"target_fingerprint": target.identity["fingerprint"], "k": 3,
                                            "max_new_tokens": 128}}))
    replay.check_inputs(args, target)
    from specdraft.infer.ngram import Datastore
    with pytest.raises(SpecdraftError, match="prepared for"):       # what replay's --datastore now passes through
        Datastore.from_prepared(other, target)


def test_store_convert_refuses_a_model_it_would_not_read(tmp_path, monkeypatch, capsys):
    """Round 4's leftover: `store convert --store-format fp8 --model X` accepted --model and ignored it (only
    compact's teacher reads a target); refused before the store is read or --out made."""
    code, err = run_cli(monkeypatch, capsys, "store", "convert", tmp_path / "nostore", "--store-format", "fp8",
                        "--model", "default", "--out", tmp_path / "out")
    assert code == 2 and "--model default: read only for --store-format compact" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, marker, kind", [
    (["prepare", "--model", "default", "--conversations", "builtin", "--regenerate", "--limit", "2"], "manifest.json",
     "a hidden-state store"),
    (["prepare", "--model", "default", "--conversations", "builtin", "--regenerate", "--limit", "2"], "metrics.jsonl",
     "a training run"),
    (["capture", "--model", "default", "--prepared", "DATA"], "prepare.json", "prepared data"),
    (["store", "convert", "STORE", "--store-format", "fp8"], "config.json", "a drafter or model folder")])
def test_a_folder_out_of_another_commands_kind_is_refused(tmp_path, monkeypatch, capsys, command, marker, kind):
    """`prepare --out WS/hidden` (or a run, an export) wrote prepared data among the store's files, exit 0: every
    folder writer (outputs.own_folder) refuses a folder another command wrote, before any work."""
    out = tmp_path / "out"
    out.mkdir()
    (out / marker).write_text("{}")
    args = [str(tmp_path / "missing") if a in ("DATA", "STORE") else a for a in command]
    code, err = run_cli(monkeypatch, capsys, *args, "--out", out)
    assert code == 2 and f"--out {out}: holds {kind}" in err and "Traceback" not in err, err
    assert sorted(p.name for p in out.iterdir()) == [marker]                  # nothing written there


def test_an_export_while_train_swaps_best_exports_one_epoch_and_records_it(tmp_path, monkeypatch):
    """An export of RUN taken while train replaced RUN/best/ (a new best) exported the older epoch's weights and
    recorded RUN/best as if it were the new one. The read is repeated until one version was read whole, and
    export.json records the epoch and step it exported."""
    import json
    import shutil

    import torch

    from specdraft.formats import checkpoints as C
    from test_drafter import tiny_drafter

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    (run / "config.yaml").write_text("epochs: 2\n")
    for epoch, folder in ((1, run / "best"), (2, tmp_path / "epoch2")):
        model, _ = tiny_drafter(seed=epoch)
        model.t2d[:40], model.d2t[:] = True, 0             # the identity draft vocabulary (the first 40 ids)
        C.save_drafter(model, folder)
        (folder / "val.json").write_text(json.dumps({"epoch": epoch, "step": 10 * epoch}))
    real, calls = C.load_checkpoint, []

    def load_while_train_swaps(folder, *a, **kw):
        read = real(folder, *a, **kw)
        if not calls:                                   # train finds a new best during the first read
            (run / "best").rename(run / ".best.old")
            shutil.copytree(tmp_path / "epoch2", run / "best")
        calls.append(folder)
        return read

    monkeypatch.setattr(C, "load_checkpoint", load_while_train_swaps)
    C.export(run, tmp_path / "export", "speculators")
    assert len(calls) == 2
    from specdraft.schemas.exports import exports_of
    (entry,) = exports_of(run)
    assert (entry.epoch, entry.step) == (2, 20)
    exported, _, _ = real(tmp_path / "export")
    newest, _, _ = real(tmp_path / "epoch2")
    assert torch.equal(exported["fc.weight"], newest["fc.weight"].to(exported["fc.weight"].dtype))   # epoch 2's


@pytest.mark.parametrize("text, expected", [("3,2,50", "total 50 is more than the 10 nodes 3 depths of top-2"),
                                            ("5,100000,16", "at most depth 64, topk 64 and total 1024"),
                                            ("1,4,5", "total 5 is more than the 4 nodes")])
def test_a_tree_larger_than_its_expansion_or_the_bounds_is_refused(text, expected):
    """`--tree 3,2,50` ran as a tree of 10 nodes (recorded as 50) and a topk past the draft vocabulary was cut in
    silence: a tree's sizes have bounds."""
    from specdraft.infer.tree import TreeShape

    with pytest.raises(SpecdraftError, match=expected):
        TreeShape.parse(text)
    assert TreeShape.parse("3,2,10").total == 10 and TreeShape.parse("5,8,60").topk == 8
