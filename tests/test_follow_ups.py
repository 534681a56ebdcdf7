"""prepare --follow-ups SHARE: that share of the self-written conversations get a second user turn,
written by the target after its first answer (data/self_prompts.py write_follow_ups), then
answered with the first answer kept; on the tiny target."""

import json

import pytest

from specdraft.data.prepare import prepare
from specdraft.data.prepared import load_prepared
from specdraft.data.regenerate import skeleton
from specdraft.data.self_prompts import FOLLOW_UPS_FILE, follow_up_indices
from specdraft.errors import SpecdraftError

pytestmark = pytest.mark.usefixtures("one_thread")

KW = dict(regenerate=True, batch_size=4, max_new_tokens=6)


def test_skeleton_keeps_written_answers_only_when_asked():
    u, a, u2 = ({"role": r, "content": c} for r, c in [("user", "q"), ("assistant", "a"), ("user", "q2")])
    slot = {"role": "assistant", "content": ""}
    assert skeleton([u, a, u2]) == [u, slot, u2, slot]
    assert skeleton([u, a, u2], keep_answers=True) == [u, a, u2, slot]


def test_follow_up_share_is_seeded_and_rounded():
    assert follow_up_indices(4, 0.5, 0) == follow_up_indices(4, 0.5, 0) and len(follow_up_indices(4, 0.5, 0)) == 2
    assert follow_up_indices(10, 0.25, 0) != follow_up_indices(10, 0.25, 1)
    assert follow_up_indices(3, 1.0, 0) == [0, 1, 2] and follow_up_indices(3, 0.0, 0) == []


def test_self_written_conversations_get_second_turns(tiny_target, tmp_path):
    plain = prepare(str(tiny_target), "self:4", tmp_path / "plain", **KW)
    assert "follow_ups" not in plain["regeneration"]
    single = {json.loads(m)[0]["content"]: json.loads(m) for m in load_prepared(tmp_path / "plain")[0]["messages"]}

    meta = prepare(str(tiny_target), "self:4", tmp_path / "out", follow_ups=0.5, **KW)
    record = meta["regeneration"]["follow_ups"]
    # 2 chosen; the tiny random target ends a usable question (>= 3 words, an end of turn) for 1
    # of them within its 4 candidate rows: the other stays one turn, and the record says so
    assert record["share"] == 0.5 and record["chosen"] == 2 and record["written"] == record["turns"] == 1
    ds, saved = load_prepared(tmp_path / "out")
    # a conversation whose first answer the template renders otherwise than generated (cut at --max-new-tokens,
    # or stripped) in the follow-up's prompt gives one sample per turn (render.Chat.render)
    assert saved == meta and meta["counts"]["samples"] == 4 + meta["counts"]["conversations_split_per_turn"]
    conversations = [json.loads(m) for m in ds["messages"]]
    two = [c for c in conversations if len(c) == 4]
    assert len(two) == 1 and all([m["role"] for m in c] == ["user", "assistant", "user", "assistant"] for c in two)
    assert all(len(c) == 2 for c in conversations if len(c) != 4)
    written = [json.loads(line)["follow_up"] for line in (tmp_path / "out" / FOLLOW_UPS_FILE).read_text().splitlines()]
    for c in two:
        assert c[:2] == single[c[0]["content"]]          # written after the first answer, which is kept
        assert c[2]["content"] in written and len(c[2]["content"].split()) >= 3
    trained = {}
    for c, mask in zip(conversations, ds["loss_mask"]):
        trained[c[0]["content"]] = trained.get(c[0]["content"], 0) + sum(mask)
    plain_ds = load_prepared(tmp_path / "plain")[0]
    plain_loss = {json.loads(m)[0]["content"]: sum(mask) for m, mask in zip(plain_ds["messages"], plain_ds["loss_mask"])}
    for c in two:   # both answers are trained
        assert trained[c[0]["content"]] > plain_loss[c[0]["content"]]

    again = prepare(str(tiny_target), "self:4", tmp_path / "out", follow_ups=0.5, **KW)   # resumes: nothing new
    assert again["regeneration"]["generated"] == 0 and again["regeneration"]["follow_ups"].get("turns", 0) == 0
    assert len((tmp_path / "out" / FOLLOW_UPS_FILE).read_text().splitlines()) == 2       # one per chosen
    assert sum(w is None for w in written) == 1
    assert load_prepared(tmp_path / "out")[0]["messages"] == ds["messages"]


def test_follow_ups_need_self_written_questions(tiny_target, tmp_path):
    with pytest.raises(SpecdraftError, match=r"^--follow-ups 0.5: only questions the target writes get follow-ups"):
        prepare(str(tiny_target), "builtin", tmp_path / "a", limit=2, follow_ups=0.5, **KW)
    with pytest.raises(SpecdraftError, match=r"^--follow-ups 1.5: must be 0..1"):
        prepare(str(tiny_target), "self:2", tmp_path / "b", follow_ups=1.5, **KW)
