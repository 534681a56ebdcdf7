import json
import subprocess
import sys

import pytest
import torch

from specdraft.data.builtin_prompts import builtin_prompts, prompt_pool
from specdraft.data.conversations import normalize
from specdraft.data.prepare import prepare
from specdraft.data.prepared import load_prepared
from specdraft.data.regenerate import PROGRESS_FILE, RegenSettings, generate_batch, load_progress
from specdraft.data.render import Chat
from specdraft.errors import SpecdraftError
from specdraft.targets import load_target

# Two cores shared with other jobs: one thread avoids oversubscription stalls in generate().
torch.set_num_threads(1)

CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]},
    {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "2+2?"},
                       {"from": "gpt", "value": "4"}, {"from": "human", "value": "3+3?"},
                       {"from": "gpt", "value": "6"}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]},
    {"messages": [{"role": "user", "content": "Tell me a long story."},
                  {"role": "assistant", "content": "Once upon a time " * 20}]},
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# builtin prompts ----------------------------------------------------------------------------

def test_builtin_prompts_distinct_deterministic_and_held_out():
    train = builtin_prompts(None, seed=0)
    assert len(set(train)) == len(train) >= 2000
    assert builtin_prompts(100, seed=0) == train[:100] == builtin_prompts(100, seed=0)
    other = builtin_prompts(None, seed=1)
    assert other != train and set(other) == set(train)
    holdout = builtin_prompts(None, split="holdout")
    assert len(holdout) >= 200 and not set(holdout) & set(train)
    assert set(holdout) | set(train) == set(prompt_pool())
    with pytest.raises(SpecdraftError, match="unknown split"):
        builtin_prompts(3, split="test")


def test_builtin_prompts_are_diverse_even_in_a_short_prefix():
    first = builtin_prompts(64, seed=0)
    kinds = {
        "explain": lambda p: "xplain" in p or "main idea" in p,
        "howto": lambda p: p.startswith(("How do I", "Give me step-by-step", "What is the easiest", "I'm a")),
        "list": lambda p: p.startswith("List ") or p.startswith("Give me ") and "one line each" in p,
        "code": lambda p: any(lang in p for lang in ("Python", "Rust", "JavaScript", " Go", " C,", "Java", "Bash")),
        "arithmetic": lambda p: any(ch.isdigit() for ch in p) and p.endswith("?"),
        "passage": lambda p: "\n\n" in p and len(p) > 200,
        "email": lambda p: " email to " in p,
        "compare": lambda p: "ompar" in p or " versus " in p or "Should I choose" in p,
    }
    for name, test in kinds.items():
        assert any(test(p) for p in first), f"no {name} prompt in the first 64"


# reading and normalising ----------------------------------------------------------------------

def test_sharegpt_roles_are_mapped():
    conv = normalize(CONVERSATIONS[1], "x")
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert conv.messages[2]["content"] == "4"


def test_empty_assistant_allowed_only_when_regenerating():
    record = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": " "}]}
    with pytest.raises(SpecdraftError, match="rec turn 1: empty assistant turn"):
        normalize(record, "rec")
    assert normalize(record, "rec", allow_empty_assistant=True).messages[1]["content"] == " "


# prepare end to end on the tiny target -------------------------------------------------------------

def test_prepare_jsonl_filters_and_counts(tiny_target, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", CONVERSATIONS)
    meta = prepare(str(tiny_target), str(data), tmp_path / "out", max_length=200)
    ds, saved = load_prepared(tmp_path / "out")
    assert saved == meta
    assert set(ds.column_names) == {"input_ids", "loss_mask", "messages", "turn"}
    counts = meta["counts"]
    assert counts["records"] == 4 and counts["samples"] == 2 == len(ds)
    assert counts["dropped"] == {"duplicate": 1, "too_long": 1, "too_few_assistant_tokens": 0, "empty_answer": 0,
                                 "over_limit": 0}
    assert counts["tokens"] == sum(len(x) for x in ds["input_ids"])
    assert counts["loss_tokens"] == sum(sum(m) for m in ds["loss_mask"])
    assert meta["target"]["fingerprint"] and len(meta["chat_template_sha256"]) == 64
    assert meta["max_length"] == 200 and meta["source_kind"] == "file"
    from specdraft.testing import tiny_tokenizer

    tok = tiny_tokenizer("chatml")
    second = ds[1]
    masked = tok.decode([t for t, m in zip(second["input_ids"], second["loss_mask"]) if m])
    assert masked == "4<|im_end|>6<|im_end|>"
    assert json.loads(second["messages"])[1] == {"role": "user", "content": "2+2?"}


def test_prepare_limit_min_tokens_and_no_dedup(tiny_target, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", CONVERSATIONS)
    meta = prepare(str(tiny_target), str(data), tmp_path / "a", dedup=False, limit=2)
    assert meta["counts"]["samples"] == 2 and meta["counts"]["dropped"]["over_limit"] == 2
    meta = prepare(str(tiny_target), str(data), tmp_path / "b", dedup=False, min_assistant_tokens=5)
    # "4" + <|im_end|> and "6" + <|im_end|>: 4 trained tokens < 5
    assert meta["counts"]["dropped"]["too_few_assistant_tokens"] == 1 and meta["counts"]["samples"] == 3


def test_prepare_json_and_parquet_sources(tiny_target, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = CONVERSATIONS[:1] + [{"messages": [{"role": "user", "content": "Q"},
                                                 {"role": "assistant", "content": "A"}]}]
    (tmp_path / "d.json").write_text(json.dumps(records))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
    a = prepare(str(tiny_target), str(tmp_path / "d.json"), tmp_path / "a")
    b = prepare(str(tiny_target), str(tmp_path / "d.parquet"), tmp_path / "b")
    assert a["counts"]["samples"] == b["counts"]["samples"] == 2
    assert load_prepared(tmp_path / "a")[0]["input_ids"] == load_prepared(tmp_path / "b")[0]["input_ids"]


# regeneration ------------------------------------------------------------------------------------

def test_left_padded_batch_matches_single_generation(tiny_target):
    target = load_target(str(tiny_target))
    settings = RegenSettings(max_new_tokens=8)
    end_ids = [target.tokenizer.eos_token_id]
    short = [{"role": "user", "content": "Hi"}]
    long = [{"role": "user", "content": "A much longer question that needs padding on the other row"}]
    short, long = (Chat(target.tokenizer, end_ids).prompt_ids(p) for p in (short, long))
    together = generate_batch(target, [short, long], settings, end_ids)
    assert together[0] == generate_batch(target, [short], settings, end_ids)[0]
    assert together[1] == generate_batch(target, [long], settings, end_ids)[0]


def test_regeneration_cache_grows_in_place_and_gives_transformers_own_answers(tiny_target):
    """padded_generate's GrowingLayer cache writes into preallocated buffers instead of concatenating, and
    the batched answers are the ones transformers' own DynamicCache gives."""
    from specdraft.data.regenerate import padded_generate
    from specdraft.kvcache import GrowingLayer, growing_cache

    target = load_target(str(tiny_target))
    model, tok = target.model, target.tokenizer
    encoded = [tok.encode(t) for t in ("hi", "a longer prompt here", "x y z w v u")]
    end = [tok.eos_token_id]
    ours = padded_generate(model, encoded, 300, end, 0)                     # past the first 256-slot buffer
    width = max(map(len, encoded))
    ids = torch.tensor([[0] * (width - len(e)) + e for e in encoded])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    theirs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=300, do_sample=False,
                            eos_token_id=end, pad_token_id=0)[:, width:].tolist()
    assert ours == theirs
    cache = growing_cache(model.config)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    k = torch.randn(1, 2, 3, 4)
    keys, _ = cache.layers[0].update(k, k)
    buffer = cache.layers[0].buffers[0]
    keys, _ = cache.layers[0].update(k[:, :, :1], k[:, :, :1])
    assert keys.shape[-2] == 4 and keys.data_ptr() == buffer.data_ptr()      # written in place, not copied
    assert torch.equal(keys[:, :, :3], k) and torch.equal(keys[:, :, 3:], k[:, :, :1])
    big = torch.randn(1, 2, 300, 4)                                          # past the buffer: it grows
    keys, _ = cache.layers[0].update(big, big)
    assert keys.shape[-2] == 304 and torch.equal(keys[:, :, :3], k) and torch.equal(keys[:, :, 4:], big)


def test_regenerate_multi_turn_turn_by_turn(tiny_target, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [CONVERSATIONS[1]])
    meta = prepare(str(tiny_target), str(data), tmp_path / "out", regenerate=True, max_new_tokens=4)
    ds, _ = load_prepared(tmp_path / "out")
    messages = json.loads(ds[len(ds) - 1]["messages"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] != "4" or messages[4]["content"] != "6"
    assert meta["regeneration"]["turns"] == 2 and meta["regeneration"]["generated"] == 1
    # Both answers were cut at 4 tokens, which the template renders in the second turn's prompt as if they
    # had ended: each turn is its own sample, as the target saw it (render.Chat.render).
    assert ds["turn"] == [2, 4] and meta["counts"]["conversations_split_per_turn"] == 1


def test_regeneration_resumes_after_a_kill(tiny_target, tmp_path):
    kw = dict(regenerate=True, limit=6, batch_size=2, max_new_tokens=6)
    first = prepare(str(tiny_target), "builtin", tmp_path / "out", **kw)
    assert first["regeneration"]["generated"] == 6 and first["counts"]["dropped"]["over_limit"] == 0
    progress = tmp_path / "out" / PROGRESS_FILE
    lines = progress.read_text().splitlines(keepends=True)
    assert len(lines) == 6
    reference = load_prepared(tmp_path / "out")[0].to_dict()

    # Simulate a kill in the middle of writing the 4th line.
    progress.write_text("".join(lines[:3]) + lines[3][:25])
    assert len(load_progress(progress)) == 3
    second = prepare(str(tiny_target), "builtin", tmp_path / "out", **kw)
    assert second["regeneration"]["reused"] == 3 and second["regeneration"]["generated"] == 3
    assert load_prepared(tmp_path / "out")[0].to_dict() == reference
    assert all(json.loads(line) for line in progress.read_text().splitlines())

    third = prepare(str(tiny_target), "builtin", tmp_path / "out", **kw)
    assert third["regeneration"]["generated"] == 0 and third["regeneration"]["reused"] == 6
    assert load_prepared(tmp_path / "out")[0].to_dict() == reference


def test_self_written_questions_are_the_targets_own_and_resume(tiny_target, tmp_path):
    """--conversations self:N: the target samples N user turns from the template's opening of a
    user turn, then answers them; a re-run (or a kill mid-way) reuses the questions written."""
    from specdraft.data.self_prompts import QUESTIONS_FILE, user_turn_opening

    kw = dict(regenerate=True, batch_size=4, max_new_tokens=6)
    first = prepare(str(tiny_target), "self:5", tmp_path / "out", **kw)
    assert first["source_kind"] == "self" and first["counts"]["samples"] == 5
    questions = tmp_path / "out" / QUESTIONS_FILE
    written = [q for line in questions.read_text().splitlines() for q in json.loads(line)["questions"]]
    prepared = load_prepared(tmp_path / "out")[0].to_dict()
    tok = load_target(str(tiny_target)).tokenizer
    opening = tok(user_turn_opening(Chat(tok, [])), add_special_tokens=False)["input_ids"]
    assert all(ids[:len(opening)] == opening for ids in prepared["input_ids"])
    assert len(set(written)) >= 5

    lines = questions.read_text().splitlines(keepends=True)
    questions.write_text("".join(lines[:1]) + lines[1][:20] if len(lines) > 1 else lines[0])   # killed mid-line
    second = prepare(str(tiny_target), "self:5", tmp_path / "out", **kw)
    assert second["counts"]["samples"] == 5
    assert load_prepared(tmp_path / "out")[0].to_dict() == prepared
    for source, options, error in [("self:0", kw, "self:N"), ("self", {}, "--regenerate"),
                                   ("self:3", dict(kw, engine="vllm"), "--engine hf")]:
        with pytest.raises(SpecdraftError, match=error):
            prepare(str(tiny_target), source, tmp_path / "bad", **options)


# bad input through the CLI: one line on stderr, exit 2 ---------------------------------------------

def bad_inputs(tmp_path, tiny_target):
    """(name, args, expected text in the error)."""
    good = write_jsonl(tmp_path / "good.jsonl", CONVERSATIONS[:1])
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(CONVERSATIONS[0]) + "\n{not json\n")
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(json.dumps(CONVERSATIONS[0]).encode() + b"\n" + json.dumps(CONVERSATIONS[0]).encode()
                       + b"\n" + '{"messages": [{"role": "user", "content": "caf\xe9"}]}'.encode("latin-1") + b"\n")
    no_field = write_jsonl(tmp_path / "nofield.jsonl", [{"text": "hello"}])
    bad_role = write_jsonl(tmp_path / "role.jsonl", [{"messages": [{"role": "robot", "content": "x"}]}])
    empty_answer = write_jsonl(tmp_path / "empty.jsonl", [{"messages": [{"role": "user", "content": "Q"},
                                                                         {"role": "assistant", "content": ""}]}])
    prompts_only = write_jsonl(tmp_path / "prompts.jsonl", [{"messages": [{"role": "user", "content": f"Q{i}"}]}
                                                            for i in range(3)])
    from specdraft.testing import save_tiny_target

    no_template = save_tiny_target(tmp_path / "no_template", template="none", num_layers=1)
    out = tmp_path / "out"
    model = ["--model", tiny_target]
    return [
        ("missing file", [*model, "--conversations", tmp_path / "missing.jsonl", "--out", out], "data file not found"),
        ("not json", [*model, "--conversations", bad_json, "--out", out], "bad.jsonl line 2: not valid JSON"),
        ("not utf-8", [*model, "--conversations", latin1, "--out", out], "latin1.jsonl line 3: not UTF-8"),
        ("no messages", [*model, "--conversations", no_field, "--out", out], "nofield.jsonl line 1: no 'messages' or"),
        ("unknown role", [*model, "--conversations", bad_role, "--out", out], "role.jsonl line 1 turn 0: unknown role 'robot'"),
        ("empty answer", [*model, "--conversations", empty_answer, "--out", out], "turn 1: empty assistant turn"),
        ("all filtered", [*model, "--conversations", good, "--out", out, "--max-length", "5"],
         "no samples left after filtering 1 conversations (1 longer than --max-length 5)"),
        ("no template", ["--model", no_template, "--conversations", good, "--out", out], "has no chat template"),
        ("builtin needs --regenerate", [*model, "--conversations", "builtin", "--out", out], "pass --regenerate"),
        # issue 36: was told to relax --min-assistant-tokens
        ("prompts only need --regenerate", [*model, "--conversations", prompts_only, "--out", out],
         "the 3 conversations hold prompts only (no assistant turn to train on); pass --regenerate"),
        ("unknown compute dtype", [*model, "--conversations", "builtin", "--regenerate", "--out", out,
                                   "--compute-dtype", "int8"],
         "--compute-dtype int8: use auto, float32, bfloat16, float16"),
    ]


def test_bad_input_is_one_line_exit_2(tiny_target, tmp_path):
    cases = bad_inputs(tmp_path, tiny_target)
    # All at once: most of each run is interpreter start-up, which overlaps well. Each into its own
    # --out (the last --out wins): one folder takes one writer at a time.
    runs = [subprocess.Popen([sys.executable, "-m", "specdraft.cli", "prepare", *map(str, args),
                              "--out", str(tmp_path / f"out-{i}")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i, (_, args, _) in enumerate(cases)]
    for (name, _, expected), proc in zip(cases, runs):
        _, stderr = proc.communicate(timeout=300)
        err = stderr.strip()
        assert proc.returncode == 2, (name, stderr)
        assert "Traceback" not in err, name
        assert len(err.splitlines()) == 1, (name, err)
        assert expected in err, (name, err)


def test_sampling_is_seeded_and_not_mixed_with_greedy(tiny_target, tmp_path):
    kw = dict(regenerate=True, limit=4, batch_size=2, max_new_tokens=6)
    greedy = prepare(str(tiny_target), "builtin", tmp_path / "out", **kw)
    hot = prepare(str(tiny_target), "builtin", tmp_path / "out", temperature=1.5, seed=3, **kw)
    # Same OUT, other settings: the greedy answers in regen.jsonl are not reused.
    assert hot["regeneration"]["reused"] == 0 and hot["regeneration"]["generated"] == 4
    sampled = load_prepared(tmp_path / "out")[0]["input_ids"]
    again = prepare(str(tiny_target), "builtin", tmp_path / "other", temperature=1.5, seed=3, **kw)
    assert load_prepared(tmp_path / "other")[0]["input_ids"] == sampled
    assert again["regeneration"]["generated"] == 4 and greedy["regeneration"]["temperature"] == 0.0


def test_prepare_parts_split_the_samples_by_index(tiny_target, tmp_path):
    """prepare --part I/N keeps samples index % N == I-1 of what the whole prepare keeps; the parts
    together are the whole, and capture refuses to cut a part again."""
    from specdraft.data.prepared import take_part

    data = write_jsonl(tmp_path / "d.jsonl", CONVERSATIONS)
    prepare(str(tiny_target), str(data), tmp_path / "whole", dedup=False)
    whole, _ = load_prepared(tmp_path / "whole")
    parts = []
    for i in (1, 2):
        meta = prepare(str(tiny_target), str(data), tmp_path / f"p{i}", dedup=False, part=(i, 2))
        ds, saved = load_prepared(tmp_path / f"p{i}")
        assert saved["part"] == [i, 2] and meta["counts"]["samples"] == len(ds)
        parts.append(ds["input_ids"])
    assert parts[0] == whole["input_ids"][0::2] and parts[1] == whole["input_ids"][1::2]
    with pytest.raises(SpecdraftError, match="already part 1/2"):
        take_part(*load_prepared(tmp_path / "p1"), (1, 2), tmp_path / "p1")


def test_prepare_says_when_answers_were_cut_at_the_token_cap():
    """prepare cut 5 of 8 answers at --max-new-tokens and said nothing (issue 28)."""
    from specdraft.data.prepare import summary_lines

    meta = {"counts": {"samples": 8, "tokens": 900, "loss_tokens": 400, "dropped": {"too_long": 0}},
            "regeneration": {"truncated_turns": 5, "max_new_tokens": 64}}
    lines = summary_lines(meta, "ws/data")
    assert lines[0] == "prepared 8 samples, 900 tokens (400 trained) -> ws/data"
    assert lines[1].startswith("warning: 5 regenerated answer(s) hit --max-new-tokens 64") and len(lines) == 2
    assert len(summary_lines({**meta, "regeneration": None}, "ws/data")) == 1


def test_regeneration_dtype_is_recorded_and_answers_of_another_dtype_are_not_reused(tiny_target, tmp_path):
    """prepare --compute-dtype: the target writes in that dtype, prepare.json says which, and a re-run in
    another dtype regenerates instead of reusing the first dtype's answers (issue 33)."""
    kw = dict(regenerate=True, limit=2, batch_size=2, max_new_tokens=4)
    bf16 = prepare(str(tiny_target), "builtin", tmp_path / "out", compute_dtype="bfloat16", **kw)
    assert bf16["regeneration"]["compute_dtype"] == "bfloat16" and bf16["regeneration"]["generated"] == 2
    again = prepare(str(tiny_target), "builtin", tmp_path / "out", compute_dtype="bfloat16", **kw)
    assert again["regeneration"]["reused"] == 2 and again["regeneration"]["generated"] == 0
    fp32 = prepare(str(tiny_target), "builtin", tmp_path / "out", compute_dtype="float32", **kw)
    assert fp32["regeneration"]["compute_dtype"] == "float32"
    assert fp32["regeneration"]["generated"] == 2 and fp32["regeneration"]["reused"] == 0
    # 'auto' in the suite (SPECDRAFT_KERNEL_PATH=linear) is float32 on every machine: the float32 answers
    auto = prepare(str(tiny_target), "builtin", tmp_path / "out", **kw)
    assert auto["regeneration"]["compute_dtype"] == "float32" and auto["regeneration"]["reused"] == 2


def test_auto_regeneration_dtype_follows_this_machines_measurement(monkeypatch):
    from transformers import LlamaConfig

    from specdraft import dtypes

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100)
    assert dtypes.auto_dtype("bfloat16", cfg, 64) == "bfloat16"
    assert dtypes.auto_dtype("auto", cfg, 64) == "float32"          # the suite: no timing
    monkeypatch.setenv("SPECDRAFT_KERNEL_PATH", "")
    asked = []
    monkeypatch.setattr(dtypes, "faster_dtype", lambda shapes, rows: asked.append((shapes, rows)) or ("bfloat16", {}))
    assert dtypes.auto_dtype("auto", cfg, 64) == "bfloat16"
    shapes, rows = asked[0]
    assert rows == 64
    # per layer q, k, v, o, gate, up, down; the head once
    assert shapes == {(64, 64): 4, (64, 32): 4, (64, 128): 4, (128, 64): 2, (64, 100): 1}
