"""TTT objective: alignment of tokens, hidden states and teacher; metrics; learnability."""

import math

import pytest
import torch

from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.module import Eagle3Drafter
from specdraft.testing import tiny_llama
from specdraft.model.eagle3.objective import ttt_forward
from specdraft.train.objective import TeacherHead, add_sums, finalize_metrics, valid_positions



V = 8   # target vocab = draft vocab in the hand-made construction
H = 16


def f(tok: torch.Tensor) -> torch.Tensor:
    """The 'next token' rule of the construction: the teacher at a position predicts f(its token)."""
    return (tok * 3 + 1) % V


def onehot_drafter():
    """A drafter whose output depends only on the token it is fed (the layer returns the token's
    embedding), with embed(tok) = one-hot(f(tok)), so it predicts f(token fed) with certainty."""
    tgt = tiny_llama(vocab_size=V, hidden_size=H, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=32)
    cfg = DrafterConfig.from_target(tgt.config, draft_vocab_size=V, aux_layer_ids=[1, 2, 3])
    drafter = Eagle3Drafter(cfg)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(torch.eye(H)[f(torch.arange(V))] * 4)
        drafter.norm.weight.fill_(1.0)
        drafter.lm_head.weight.copy_(torch.eye(V, H) * 30)
    drafter.layers[0].forward = lambda embeds, hidden, cos, sin, mask, cache: embeds + 0 * hidden
    teacher = TeacherHead(torch.ones(H), torch.eye(V, H) * 30, eps=cfg.rms_norm_eps)
    return drafter, teacher


def batch_for(ids, doc_ids=None, loss_mask=None, corrupt=()):
    """last[t] = embed(ids[t]) so the teacher at t predicts f(ids[t]) exactly like the drafter fed ids[t]."""
    B, T = ids.shape
    doc_ids = torch.zeros(B, T, dtype=torch.long) if doc_ids is None else doc_ids
    last = torch.eye(H)[f(ids)] * 4
    for b, t in corrupt:                      # the teacher at (b, t) predicts something else
        last[b, t] = torch.eye(H)[(f(ids[b, t]) + 1) % V] * 4
    pos = torch.zeros_like(ids)
    for b in range(B):
        for t in range(1, T):
            pos[b, t] = pos[b, t - 1] + 1 if doc_ids[b, t] == doc_ids[b, t - 1] else 0
    return {"input_ids": ids, "aux": torch.randn(B, T, 3, H), "last": last,
            "loss_mask": torch.ones(B, T, dtype=torch.uint8) if loss_mask is None else loss_mask,
            "doc_ids": doc_ids, "position_ids": pos}


def test_alignment_right_shift_gives_zero_loss_and_full_accuracy():
    torch.manual_seed(0)
    drafter, teacher = onehot_drafter()
    ids = torch.randint(0, V, (2, 24))
    loss, sums = ttt_forward(drafter, teacher, batch_for(ids), steps=3)
    m = finalize_metrics(sums)
    assert loss.item() == pytest.approx(0.0, abs=1e-5)
    for k in range(3):
        assert m[f"full_acc_{k}"] == 1.0 and m[f"cond_acc_{k}"] == 1.0
    assert m["accept_len"] == pytest.approx(4.0)


def test_alignment_off_by_one_is_detected():
    """Feeding the teacher of the wrong position (shift by one) breaks the construction."""
    torch.manual_seed(0)
    drafter, teacher = onehot_drafter()
    ids = torch.randint(0, V, (2, 24))
    batch = batch_for(ids)
    batch["last"] = torch.roll(batch["last"], 1, dims=1)     # teacher one position late
    loss, sums = ttt_forward(drafter, teacher, batch, steps=2)
    assert loss.item() > 1.0
    assert finalize_metrics(sums)["full_acc_0"] < 0.5


def test_metrics_on_a_known_error_pattern():
    """One doc of 8 tokens, steps=2, teacher wrong at t'=3: step 0 fails at t=2, step 1 at t=1."""
    drafter, teacher = onehot_drafter()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0]])
    _, sums = ttt_forward(drafter, teacher, batch_for(ids, corrupt=[(0, 3)]), steps=2)
    m = finalize_metrics(sums)
    assert sums["count_0"] == 6 and sums["count_1"] == 5
    assert m["full_acc_0"] == pytest.approx(5 / 6)
    assert m["full_acc_1"] == pytest.approx(3 / 5)          # correct through 1: t = 0, 3, 4
    assert m["cond_acc_1"] == pytest.approx(3 / 4)          # of t = 0, 1, 3, 4 correct at step 0
    assert m["accept_len"] == pytest.approx(1 + 5 / 6 + 5 / 6 * 3 / 4)


def test_documents_and_loss_mask_limit_positions():
    doc = torch.tensor([[0, 0, 0, 0, 1, 1, 1, -1]])
    mask = torch.tensor([[0, 1, 1, 1, 0, 1, 1, 0]], dtype=torch.uint8)
    # step 0 predicts t+2: t=0 -> 2 (doc 0, trained), t=1 -> 3, t=2 -> 4 (other doc), t=4 -> 6
    assert valid_positions(doc, mask, 0).nonzero()[:, 1].tolist() == [0, 1, 4]
    assert valid_positions(doc, mask, 1).nonzero()[:, 1].tolist() == [0]
    drafter, teacher = onehot_drafter()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0]])
    _, sums = ttt_forward(drafter, teacher, batch_for(ids, doc, mask), steps=2)
    assert (sums["count_0"], sums["count_1"]) == (3, 1)


def test_finalize_and_add_sums():
    s = {"loss_sum_0": torch.tensor(4.0, dtype=torch.float64), "count_0": torch.tensor(8.0, dtype=torch.float64),
         "full_correct_0": torch.tensor(6.0, dtype=torch.float64), "prev_correct_0": torch.tensor(8.0, dtype=torch.float64)}
    total = add_sums(add_sums(None, s), s)
    m = finalize_metrics(total)
    assert m["loss_0"] == 0.5 and m["full_acc_0"] == 0.75 and m["accept_len"] == 1.75
    assert math.isnan(finalize_metrics({"loss_sum_0": 0.0, "count_0": 0.0, "full_correct_0": 0.0,
                                        "prev_correct_0": 0.0})["loss_0"])


def test_ce_loss_and_teacher_from_target():
    torch.manual_seed(0)
    tgt = tiny_llama(vocab_size=50, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2)
    d2t = torch.tensor([0, 1, 3, 5, 10, 20, 30, 30])        # draft ids 0..7 -> targets 0,2,5,8,14,25,36,37
    head = TeacherHead.from_target(tgt, d2t)
    last = torch.randn(5, 32)
    full = tgt.lm_head(tgt.model.norm(last))                # [5, 50]
    rows = torch.arange(8) + d2t
    torch.testing.assert_close(head.log_probs(last), torch.log_softmax(full[:, rows], -1), atol=1e-5, rtol=1e-5)



def test_teacher_norm_is_bit_identical_to_the_written_out_rmsnorm():
    """TeacherHead uses F.rms_norm; on this CPU it gives the bits of the formula it replaced
    (x * rsqrt(mean(x^2) + eps) * w), so a seeded run's metrics did not move (test_train_golden)."""
    g = torch.Generator().manual_seed(0)
    w, rows = torch.randn(64, generator=g), torch.randn(10, 64, generator=g)
    head = TeacherHead(w, rows, eps=1e-5)
    for last in (torch.randn(3, 7, 64, generator=g) * 4, torch.randn(50, 64, generator=g).bfloat16()):
        x = last.float()
        written_out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
        assert torch.equal(head.logits(last), torch.nn.functional.linear(written_out, rows))

def test_tiny_drafter_overfits_four_samples():
    """Real (random) target hidden states, 4 samples: the drafter learns the teacher's argmax (CE:
    the random target's distributions are flat, so KL alone converges to near-ties)."""
    torch.manual_seed(0)
    tgt = tiny_llama(vocab_size=64, hidden_size=32, num_layers=6, num_heads=4, num_kv_heads=2)
    d2t = torch.zeros(64, dtype=torch.long)
    cfg = DrafterConfig.from_target(tgt.config, draft_vocab_size=64, aux_layer_ids=[2, 3, 4])
    drafter = Eagle3Drafter(cfg)
    drafter.init_from_target(tgt, d2t, torch.ones(64, dtype=torch.bool))
    teacher = TeacherHead.from_target(tgt, d2t)
    ids = torch.randint(0, 64, (4, 24))
    with torch.no_grad():
        out = tgt(ids, output_hidden_states=True)
    hs = out.hidden_states
    aux = torch.stack([hs[2], hs[3], hs[4]], dim=2)          # [4, 24, 3, 32]
    captured = {}
    handle = tgt.model.layers[-1].register_forward_hook(lambda m, a, o: captured.update(last=o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        tgt(ids)
    handle.remove()
    batch = {"input_ids": ids, "aux": aux, "last": captured["last"], "loss_mask": torch.ones(4, 24, dtype=torch.uint8),
             "doc_ids": torch.zeros(4, 24, dtype=torch.long), "position_ids": torch.arange(24).expand(4, 24)}
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(60):
        loss, sums = ttt_forward(drafter, teacher, batch, steps=2, loss="ce")
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval()
    with torch.no_grad():
        _, sums = ttt_forward(drafter, teacher, batch, steps=2)
    m = finalize_metrics(sums)
    assert m["full_acc_0"] > 0.95, m


@pytest.mark.parametrize("loss", ["tv", "jsd"])
def test_acceptance_style_losses_are_zero_on_a_perfect_drafter_and_positive_otherwise(loss):
    torch.manual_seed(0)
    drafter, teacher = onehot_drafter()
    ids = torch.randint(0, V, (2, 24))
    perfect, _ = ttt_forward(drafter, teacher, batch_for(ids), steps=2, loss=loss)
    assert perfect.item() == pytest.approx(0.0, abs=1e-5)
    wrong, _ = ttt_forward(drafter, teacher, batch_for(ids, corrupt=[(0, t) for t in range(2, 20)]), steps=2,
                           loss=loss)
    assert wrong.item() > 0.1
    p, q = torch.log_softmax(torch.randn(5, V), -1), torch.log_softmax(torch.randn(5, V), -1)
    from specdraft.train.objective import position_loss
    tv = position_loss(q, p, p.argmax(-1), "tv")
    torch.testing.assert_close(tv, 1 - torch.minimum(p.exp(), q.exp()).sum(-1))   # 1 - acceptance chance
    assert (position_loss(q, p, p.argmax(-1), "jsd") <= math.log(2) + 1e-6).all()


def test_draft_inputs_feed_the_drafters_own_prediction_at_later_steps():
    """ttt_inputs='draft': step 1 at position t reads what step 0 drafted there, not token t+2 of
    the data. On data that follows the drafter's rule both feeds agree; on random data only the
    teacher-forced feed keeps step 1 right (the drafter's own token is then wrong)."""
    torch.manual_seed(0)
    drafter, teacher = onehot_drafter()
    chain = torch.zeros(1, 24, dtype=torch.long)
    for t in range(1, 24):
        chain[0, t] = f(chain[0, t - 1])
    for inputs in ("data", "draft"):
        m = finalize_metrics(ttt_forward(drafter, teacher, batch_for(chain), steps=3, inputs=inputs)[1])
        assert m["full_acc_2"] == 1.0
    ids = torch.randint(0, V, (2, 24))
    data = finalize_metrics(ttt_forward(drafter, teacher, batch_for(ids), steps=2, inputs="data")[1])
    drafted = finalize_metrics(ttt_forward(drafter, teacher, batch_for(ids), steps=2, inputs="draft")[1])
    assert data["full_acc_0"] == drafted["full_acc_0"] == 1.0
    assert data["cond_acc_1"] == 1.0 and drafted["cond_acc_1"] < 0.5
