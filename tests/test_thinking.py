"""Thinking targets (issue 55): template arguments, answers as the ids the target generated, reasoning in the
data, multi-turn on templates that drop reasoning, τ per thinking mode. The templates are the tests' own
(testing.QWEN3_THINK, KIMI_THINK, HARMONY) in the formats of Qwen3, Kimi-K2.5 and gpt-oss."""

from __future__ import annotations

import json

import pytest

from specdraft.data.conversations import normalize
from specdraft.data.render import Chat, encode, end_of_turn_ids
from specdraft.errors import SpecdraftError
from specdraft.templates import check_template_kwargs, parse_template_kwargs
from specdraft.testing import tiny_tokenizer

HARMONY_ENDS = ("<|return|>", "<|call|>")      # the adapter's end tokens for gpt-oss
# (template, its template arguments, the thinking mode they give)
STYLES = [("qwen3-think", {}, "on"), ("qwen3-think", {"enable_thinking": False}, "off"),
          ("kimi-think", {}, "on"), ("kimi-think", {"thinking": False}, "off"),
          ("harmony", {"reasoning_effort": "low"}, "on"), ("harmony", {"reasoning_effort": "high"}, "on")]
QUESTION = {"role": "user", "content": "Why is the sky blue?"}
REASONING = "User asks about the sky. Explain scattering."
ANSWER = "Rayleigh scattering: blue light scatters most."


def chat_for(template: str, kwargs: dict | None = None) -> Chat:
    tok = tiny_tokenizer(template)
    return Chat(tok, end_of_turn_ids(tok, end_tokens=HARMONY_ENDS if template == "harmony" else ()), kwargs or {})


def answered(chat: Chat, mode: str) -> dict:
    return {"role": "assistant", "content": ANSWER, **({"reasoning_content": REASONING} if mode == "on" else {})}


def generated_ids(chat: Chat, messages: list[dict]) -> list[int]:
    """What the target emits for the last assistant turn: the template's own rendering beyond its prompt,
    through the end-of-turn id (what a target trained on this format generates)."""
    full = encode(chat.tokenizer, chat.text(messages, False))
    prompt = chat.prompt_ids(messages[:-1])
    assert full[:len(prompt)] == prompt
    rest = full[len(prompt):]
    return rest[:next(i for i, t in enumerate(rest) if t in chat.end_ids) + 1]


@pytest.mark.parametrize("template,kwargs,mode", STYLES)
def test_generated_answer_round_trips_token_for_token(template, kwargs, mode):
    chat = chat_for(template, kwargs)
    assert chat.mode() == mode
    conversation = [QUESTION, answered(chat, mode)]
    ids = generated_ids(chat, conversation)
    prompt = chat.prompt_ids([QUESTION])
    answer = chat.answer(prompt, ids + [chat.end_ids[0]] * 3, hit_length=False)   # padding after the end id
    assert answer.message["token_ids"] == ids and not answer.truncated and answer.new_tokens == len(ids)
    assert answer.message["content"] == ANSWER
    assert answer.message.get("reasoning_content", "") == (REASONING if mode == "on" else "")
    # trained: the generated ids; the sample is the template's own rendering of that conversation
    [sample] = chat.render([QUESTION, answer.message])
    assert sample.input_ids == prompt + ids and sample.loss_mask == [0] * len(prompt) + [1] * len(ids)
    parsed = [QUESTION, {k: v for k, v in answer.message.items() if k != "token_ids"}]
    assert chat.render(parsed)[0].input_ids == sample.input_ids


def test_harmony_answer_keeps_its_channels():
    """The issue's gpt-oss example: before, the stored answer was 'analysisUser asks ...' and the trained text
    '<|channel|>final<|message|>analysisUser asks ...<|return|>'; now the channels are trained as generated."""
    chat = chat_for("harmony")
    emitted = ("<|channel|>analysis<|message|>User asks about rainbows.<|end|><|start|>assistant<|channel|>final"
               "<|message|>Explain refraction.<|return|>")
    ids = encode(chat.tokenizer, emitted)
    prompt = chat.prompt_ids([{"role": "user", "content": "Rainbows?"}])
    answer = chat.answer(prompt, ids, hit_length=False)
    assert answer.message["content"] == "Explain refraction."
    assert answer.message["reasoning_content"] == "User asks about rainbows."
    [sample] = chat.render([{"role": "user", "content": "Rainbows?"}, answer.message])
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask) if m]
    assert chat.tokenizer.decode(trained) == emitted
    # <|end|> closes the analysis message inside the answer: it does not end the turn
    assert chat.tokenizer.convert_tokens_to_ids("<|end|>") not in chat.end_ids
    assert chat.reasoning_length(prompt, ids) == ids.index(chat.tokenizer.convert_tokens_to_ids("<|end|>")) + 1


def test_answer_ids_are_trained_as_generated_never_rendered_again():
    """Ids that decode and re-render to other ids (spaces the template's text would strip, a special token in
    the middle of the text) are trained as they were generated."""
    chat = chat_for("chatml")
    tok = chat.tokenizer
    prompt = chat.prompt_ids([{"role": "user", "content": "hi"}])
    ids = encode(tok, "  two spaces <|im_start|> inside  ") + [tok.convert_tokens_to_ids("<|im_end|>")]
    answer = chat.answer(prompt, ids, hit_length=False)
    [sample] = chat.render([{"role": "user", "content": "hi"}, answer.message])
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == ids
    assert chat.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": answer.message["content"]}
                        ])[0].input_ids != sample.input_ids       # the re-rendered text would have trained other ids


def test_answer_cut_by_the_length_limit_is_counted():
    chat = chat_for("kimi-think")
    prompt = chat.prompt_ids([QUESTION])
    ids = encode(chat.tokenizer, "Still reasoning about")
    answer = chat.answer(prompt, ids, hit_length=True)
    assert answer.truncated and answer.message["token_ids"] == ids
    assert answer.message["reasoning_content"] == "Still reasoning about" and answer.message["content"] == ""
    assert chat.reasoning_length(prompt, ids) == len(ids)


@pytest.mark.parametrize("template,kwargs,mode", STYLES)
def test_multi_turn_prepares_as_the_model_saw_each_turn(template, kwargs, mode):
    chat = chat_for(template, kwargs)
    conversation = [QUESTION, answered(chat, mode), {"role": "user", "content": "And sunsets?"},
                    {"role": "assistant", "content": "The light crosses more air.",
                     **({"reasoning_content": "Sunset question."} if mode == "on" else {})}]
    samples = chat.render(conversation)          # never refused
    assert samples and samples[-1].num_loss_tokens
    for sample in samples:
        # each sample is the template's own rendering of the conversation up to its last trained turn
        shown = encode(chat.tokenizer, chat.text(sample.messages, False))
        assert sample.input_ids == shown[:len(sample.input_ids)]
    if mode == "on":       # the second turn's prompt drops the first turn's reasoning: one sample per turn
        assert [s.turn for s in samples] == [1, 3]
        assert REASONING not in chat.tokenizer.decode(samples[1].input_ids)
        assert REASONING in chat.tokenizer.decode(samples[0].input_ids)


def test_reasoning_in_input_records_is_rendered_where_the_template_reads_it():
    for field in ("reasoning_content", "reasoning", "thinking"):
        record = {"messages": [QUESTION, {"role": "assistant", "content": ANSWER, field: REASONING}]}
        conversation = normalize(record, "d.jsonl line 1")
        assert conversation.messages[1]["reasoning_content"] == REASONING
        for template in ("qwen3-think", "kimi-think", "harmony"):
            text = chat_for(template).text(conversation.messages, False)
            assert REASONING in text, (field, template)
    with pytest.raises(SpecdraftError, match="d.jsonl line 2 turn 1: 'reasoning' must be a string"):
        normalize({"messages": [QUESTION, {"role": "assistant", "content": "x", "reasoning": 3}]}, "d.jsonl line 2")
    with pytest.raises(SpecdraftError, match="a user turn with 'reasoning_content'"):
        normalize({"messages": [{**QUESTION, "reasoning_content": "no"}]}, "d.jsonl line 3")


def test_template_arguments_are_checked_in_one_line():
    assert parse_template_kwargs('{"enable_thinking": false}') == {"enable_thinking": False}
    for bad, why in (('{"enable_thinking": fals}', "not valid JSON"), ("[1]", "a JSON list, not an object"),
                     ('{"add_generation_prompt": true}', "set by specdraft itself")):
        with pytest.raises(SpecdraftError, match=f"--chat-template-kwargs.*{why}"):
            parse_template_kwargs(bad)
    tok = tiny_tokenizer("qwen3-think")
    check_template_kwargs(tok, {"enable_thinking": False}, "m")
    with pytest.raises(SpecdraftError, match="--chat-template-kwargs: the chat template of m never reads "
                                             "'enable_thinkng'"):
        check_template_kwargs(tok, {"enable_thinkng": False}, "m")


def test_tau_by_part_splits_rounds_at_the_end_of_reasoning():
    from specdraft.infer.bench import tau_by_part
    from specdraft.infer.speculative import Generation

    chat = chat_for("qwen3-think")
    prompt = chat.prompt_ids([QUESTION])
    ids = encode(chat.tokenizer, f"<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>")
    cut = chat.reasoning_length(prompt, ids)
    assert chat.tokenizer.decode(ids[:cut]).endswith("</think>")
    # three rounds drafting reasoning (positions 0, 5, cut-1), two drafting the answer (cut, cut+4)
    g = Generation(token_ids=ids, seconds=1.0, target_forwards=6, accepted=[2, 1, 0, 3, 3],
                   contexts=[len(prompt) + p for p in (0, 5, cut - 1, cut, cut + 4)])
    parts = tau_by_part(chat, [prompt], [g])
    assert parts == {"reasoning": {"tau": (3 + 3) / 3, "rounds": 3}, "answer": {"tau": (6 + 2) / 2, "rounds": 2}}
    assert tau_by_part(chat_for("chatml"), [prompt], [g]) is None


# The pipeline per template style and thinking mode, on tiny targets of the architectures that use them ------

PIPELINES = [("qwen3", "qwen3-think", {}), ("qwen3", "qwen3-think", {"enable_thinking": False}),
             ("kimi_k25", "kimi-think", {}), ("kimi_k25", "kimi-think", {"thinking": False}),
             ("gpt_oss", "harmony", {"reasoning_effort": "low"}), ("gpt_oss", "harmony", {"reasoning_effort": "high"})]


@pytest.mark.parametrize("arch,template,kwargs", PIPELINES, ids=[f"{t}-{json.dumps(k)}" for _, t, k in PIPELINES])
def test_prepare_capture_train_bench_per_thinking_mode(arch, template, kwargs, tmp_path):
    from arch_pipeline import invoke

    from specdraft.data.prepared import load_prepared
    from specdraft.testing import save_tiny_arch

    target = str(save_tiny_arch(tmp_path / "target", arch, template=template))
    args = ["--chat-template-kwargs", json.dumps(kwargs)]
    for argv in (["prepare", "--model", target, "--conversations", "builtin", "--regenerate", "--limit", "4",
                  "--max-new-tokens", "24", "--batch-size", "4", "--out", "ws/data", *args],
                 ["capture", "--model", target, "--prepared", "ws/data", "--out", "ws/hidden", "--store-dtype",
                  "float32", "--batch-tokens", "256"],
                 ["vocab", "build", "--prepared", "ws/data", "--size", "64", "--out", "ws/vocab.safetensors"],
                 ["train", "--model", target, "--store", "ws/hidden", "--vocab", "ws/vocab.safetensors", "--out",
                  "ws/runs/a", "--epochs", "1", "--max-tokens", "128", "--precision", "fp32", "--val-fraction", "0.25",
                  "--warmup-steps", "1"],
                 ["eval", "--model", target, "--drafter", "ws/runs/a", "--store", "ws/hidden", "--out",
                  "ws/runs/a/eval.json"],
                 ["bench", "--model", target, "--drafter", "ws/runs/a", "--methods", "greedy,eagle3", "--limit", "2",
                  "--max-new-tokens", "16", "--rounds", "1", "-k", "2", "--out", "ws/runs/a/bench.json", *args]):
        code, text = invoke(argv, tmp_path)
        assert code == 0, (argv[0], text[-600:])
    chat = chat_for(template, kwargs)
    mode = chat.mode()
    ds, meta = load_prepared(tmp_path / "ws/data")
    assert meta["chat_template_kwargs"] == kwargs and meta["thinking"] == {"style": chat.style, "mode": mode}
    # the trained ids of each sample are the ids the target generated, after the template's own prompt
    generated = [m["token_ids"] for r in map(json.loads, (tmp_path / "ws/data/regen.jsonl").read_text().splitlines())
                 for m in r["messages"] if m["role"] == "assistant"]
    for ids, mask, messages, turn in zip(ds["input_ids"], ds["loss_mask"], ds["messages"], ds["turn"]):
        start = mask.index(1)
        assert ids[:start] == chat.prompt_ids(json.loads(messages)[:turn])
        assert ids[start:] in generated
    evaluated = json.loads((tmp_path / "ws/runs/a/eval.json").read_text())
    assert evaluated["thinking"] == {"style": chat.style, "mode": mode, "chat_template_kwargs": kwargs}
    assert evaluated["tau_by_part"] and all(p["positions"] > 0 for p in evaluated["tau_by_part"].values())
    bench = json.loads((tmp_path / "ws/runs/a/bench.json").read_text())
    assert bench["config"]["thinking"] == {"style": chat.style, "mode": mode}
    assert bench["config"]["chat_template_kwargs"] == kwargs
    eagle = bench["methods"]["eagle3"]
    assert eagle["identical_to_greedy"]
    parts = eagle["tau_by_part"]
    assert sum(p["rounds"] for p in parts.values()) == eagle["target_forwards"] - bench["config"]["num_prompts"]

    # prepare again with other template arguments: no answer of these is reused
    other = {"qwen3-think": {"enable_thinking": not kwargs.get("enable_thinking", True)},
             "kimi-think": {"thinking": not kwargs.get("thinking", True)},
             "harmony": {"reasoning_effort": "medium"}}[template]
    code, text = invoke(["prepare", "--model", target, "--conversations", "builtin", "--regenerate", "--limit", "4",
                         "--max-new-tokens", "24", "--batch-size", "4", "--out", "ws/data", "--chat-template-kwargs",
                         json.dumps(other)], tmp_path)
    assert code == 0, text[-600:]
    again = json.loads((tmp_path / "ws/data/prepare.json").read_text())
    assert again["regeneration"]["reused"] == 0 and again["chat_template_kwargs"] == other


@pytest.mark.parametrize("value,why", [("[1]", "a JSON list, not an object"), ("{bad", "not valid JSON"),
                                       ('{"enable_thinkng": false}', "never reads 'enable_thinkng'")])
def test_bad_template_arguments_are_one_line_naming_the_flag_and_nothing_is_written(value, why, tmp_path):
    from arch_pipeline import invoke

    from specdraft.testing import save_tiny_arch

    target = str(save_tiny_arch(tmp_path / "target", "qwen3", template="qwen3-think"))
    for argv in (["prepare", "--model", target, "--conversations", "builtin", "--regenerate", "--limit", "2",
                  "--out", "ws/data"],
                 ["bench", "--model", target, "--methods", "greedy,plain", "--limit", "1", "--out", "ws/bench.json"],
                 ["generate", "--model", target, "--method", "greedy", "--prompt", "hi"]):
        code, text = invoke([*argv, "--chat-template-kwargs", value], tmp_path)
        error = [line for line in text.splitlines() if line.startswith("error:")]
        assert code == 2 and len(error) == 1 and "--chat-template-kwargs" in error[0] and why in error[0], text
        assert "Traceback" not in text
    assert not (tmp_path / "ws/data/prepare.json").exists() and not (tmp_path / "ws/bench.json").exists()
    assert not [p for p in (tmp_path / "ws").rglob("*") if p.is_file()]      # no answer, no question, no result


def test_eval_parts_split_each_packed_answer_at_its_own_reasoning():
    import torch

    from specdraft.analysis.probe import part_masks

    chat = chat_for("kimi-think")
    prompt = chat.prompt_ids([QUESTION])
    thought = encode(chat.tokenizer, f"{REASONING}</think>{ANSWER}<|im_end|>")       # the prompt opened <think>
    closed = Chat(chat.tokenizer, chat.end_ids, {"thinking": False}).prompt_ids([QUESTION])
    plain = encode(chat.tokenizer, f"{ANSWER}<|im_end|>")
    ids = prompt + thought + closed + plain                                       # two samples packed in one row
    mask = [0] * len(prompt) + [1] * len(thought) + [0] * len(closed) + [1] * len(plain)
    positions = list(range(len(prompt) + len(thought))) + list(range(len(closed) + len(plain)))
    batch = {"input_ids": torch.tensor([ids]), "loss_mask": torch.tensor([mask], dtype=torch.uint8),
             "doc_ids": torch.zeros(1, len(ids), dtype=torch.long), "position_ids": torch.tensor([positions])}
    parts = {name: (factor, n) for name, factor, n in part_masks(batch, chat)}
    cut = chat.reasoning_length(prompt, thought)
    assert cut == len(encode(chat.tokenizer, f"{REASONING}</think>"))
    assert parts["reasoning"][1] == cut and parts["answer"][1] == len(thought) - cut + len(plain)
    assert int(parts["reasoning"][0].sum()) == cut


def test_info_says_what_the_template_writes(tmp_path):
    from specdraft.targets import info
    from specdraft.testing import save_tiny_arch

    assert info(str(save_tiny_arch(tmp_path / "q", "qwen3", template="qwen3-think")))["thinking"].startswith(
        "think-tags, on by default")
    assert info(str(save_tiny_arch(tmp_path / "g", "gpt_oss", template="harmony")))["thinking"].startswith(
        "harmony, on by default")
    assert info(str(save_tiny_arch(tmp_path / "l", "llama")))["thinking"] == "none"
