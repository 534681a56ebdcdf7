import pytest

from specdraft.data.render import Chat, encode, end_of_turn_ids, require_chat_template
from specdraft.errors import SpecdraftError
from specdraft.testing import tiny_tokenizer


def render(tok, messages, end_ids, where=""):
    """The one sample of a conversation whose template renders earlier turns as they were written."""
    samples = Chat(tok, end_ids).render(messages, where)
    assert len(samples) == 1
    return samples[0]

END = {"chatml": "<|im_end|>", "chatml-system": "<|im_end|>", "llama3": "<|eot_id|>"}

MULTI_TURN = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "2+2 is 4."},
    {"role": "user", "content": "And times 3?"},
    {"role": "assistant", "content": "That makes 12.\nAnything else?"},
    {"role": "user", "content": "No, thanks!"},
    {"role": "assistant", "content": "You're welcome."},
]
WITH_SYSTEM = [{"role": "system", "content": "Answer in one line."}] + MULTI_TURN[:2]


def masked_spans(tok, sample) -> list[str]:
    """Decode each run of consecutive loss-masked tokens."""
    spans, run = [], []
    for token, m in zip(sample.input_ids + [None], sample.loss_mask + [0]):
        if m:
            run.append(token)
        elif run:
            spans.append(tok.decode(run))
            run = []
    return spans


@pytest.mark.parametrize("template", ["chatml", "llama3", "chatml-system"])
@pytest.mark.parametrize("messages", [MULTI_TURN, WITH_SYSTEM, MULTI_TURN[:2]])
def test_mask_is_exactly_the_assistant_turns(template, messages):
    tok = tiny_tokenizer(template)
    sample = render(tok, messages, end_of_turn_ids(tok))
    full = encode(tok, tok.apply_chat_template(messages, tokenize=False))
    # the template's own rendering, up to the last answer's end-of-turn token (the "\n" after it is never generated)
    assert sample.input_ids == full[:len(sample.input_ids)] and tok.decode(full[len(sample.input_ids):]).strip() == ""
    assert len(sample.loss_mask) == len(sample.input_ids)
    expected = [m["content"] + END[template] for m in messages if m["role"] == "assistant"]
    assert masked_spans(tok, sample) == expected
    # Nothing outside the assistant turns: the role headers and the system prompt stay unmasked.
    assert sample.num_loss_tokens == sum(len(encode(tok, e)) for e in expected)


def test_default_system_prompt_is_not_trained():
    tok = tiny_tokenizer("chatml-system")
    sample = render(tok, MULTI_TURN[:2], end_of_turn_ids(tok))
    text = tok.decode(sample.input_ids)
    assert "You are a tiny helpful assistant." in text
    assert masked_spans(tok, sample) == ["2+2 is 4.<|im_end|>"]


def test_llama3_bos_is_not_doubled():
    tok = tiny_tokenizer("llama3")
    sample = render(tok, MULTI_TURN[:2], end_of_turn_ids(tok))
    assert sample.input_ids.count(tok.convert_tokens_to_ids("<|begin_of_text|>")) == 1
    assert sample.input_ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>")


def test_leading_assistant_turn_is_context_only():
    tok = tiny_tokenizer("chatml")
    messages = [{"role": "assistant", "content": "Hi, how can I help?"}] + MULTI_TURN[:2]
    sample = render(tok, messages, end_of_turn_ids(tok))
    assert masked_spans(tok, sample) == ["2+2 is 4.<|im_end|>"]


def test_template_that_rewrites_earlier_turns_gives_one_sample_per_turn():
    tok = tiny_tokenizer("chatml")
    # Drops the content of every assistant turn but the last (as reasoning-stripping templates do).
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                         "{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}{% endif %}"
                         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    samples = Chat(tok, end_of_turn_ids(tok)).render(MULTI_TURN)
    assert [s.turn for s in samples] == [1, 3, 5]
    for sample, turn in zip(samples, (1, 3, 5)):
        # each turn as the model saw it: the earlier answers emptied by the template, its own answer trained
        assert masked_spans(tok, sample) == [MULTI_TURN[turn]["content"] + "<|im_end|>"]
        assert tok.decode(sample.input_ids) == tok.apply_chat_template(MULTI_TURN[:turn + 1], tokenize=False).rstrip("\n")


def test_template_error_names_the_record():
    tok = tiny_tokenizer("chatml")
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(SpecdraftError, match="data.jsonl line 3: .*roles must alternate"):
        render(tok, MULTI_TURN, end_of_turn_ids(tok), where="data.jsonl line 3")


def test_no_chat_template_is_one_clear_error():
    with pytest.raises(SpecdraftError, match="--model m: the tokenizer has no chat template; pass a model with"):
        require_chat_template(tiny_tokenizer("none"), "m")


def test_end_of_turn_ids():
    tok = tiny_tokenizer("llama3")
    ids = end_of_turn_ids(tok)
    assert tok.convert_tokens_to_ids("<|eot_id|>") in ids and tok.convert_tokens_to_ids("<|im_end|>") in ids
    assert tok.convert_tokens_to_ids("<|start_header_id|>") not in ids
