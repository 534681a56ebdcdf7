"""Speculative sampling keeps the target's distribution: the first emitted token of a round,
drawn through draft -> accept/reject -> residual, is distributed as the target's p."""

import math

import pytest
import torch

from specdraft.errors import SpecdraftError
from specdraft.model.eagle3.proposer import EagleProposer
from specdraft.infer.sampling import Sampling, accept_draft, probabilities, sample
from specdraft.infer.speculative import generate, sample_chain
from specdraft.infer.tree import Draft
from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.module import Eagle3Drafter
from specdraft.testing import tiny_llama


def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def tv_bound(p: torch.Tensor, n: int) -> float:
    """Twice the expected total-variation distance of an n-sample empirical distribution of p
    (E|X/n - p_i| ~ sqrt(2 p_i (1 - p_i) / (pi n)) per category)."""
    return 2 * 0.5 * float(torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())


def first_token_counts(p, q, n, seed=0):
    """Emulate the round's first position n times: draft x ~ q, then the rejection rule."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros_like(p)
    for _ in range(n):
        x = sample(q, g)
        ok, replacement = accept_draft(p, q, x, g)
        counts[x if ok else replacement] += 1
    return counts


def test_rejection_rule_keeps_p_synthetic():
    # q puts mass where p has little and none on some of p's tokens (outside the draft vocab)
    p = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.10, 0.05, 0.05, 0.05, 0.0, 0.0])
    q = torch.tensor([0.05, 0.40, 0.0, 0.25, 0.0, 0.0, 0.10, 0.0, 0.20, 0.0])
    n = 8000
    counts = first_token_counts(p, q, n)
    bound = tv_bound(p, n)
    assert tv(counts, p) < bound
    assert tv(q * n, p) > 5 * bound          # the test can tell q from p
    assert counts[8] == 0 and counts[9] == 0  # never a token p forbids


def test_deterministic_proposer_keeps_p():
    p = torch.tensor([0.5, 0.3, 0.2])
    g = torch.Generator().manual_seed(1)
    n = 6000
    counts = torch.zeros(3)
    for _ in range(n):
        ok, replacement = accept_draft(p, None, 1, g)           # n-gram: always proposes token 1
        counts[1 if ok else replacement] += 1
    assert tv(counts, p) < tv_bound(p, n)


def test_top_p_matches_transformers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    s = Sampling(temperature=0.7, top_p=0.8)
    scores = TopPLogitsWarper(0.8)(None, TemperatureLogitsWarper(0.7)(None, logits.clone()))
    torch.testing.assert_close(probabilities(logits, s), torch.softmax(scores, -1), atol=1e-6, rtol=1e-5)
    with pytest.raises(SpecdraftError, match="--top-p"):
        Sampling(temperature=1.0, top_p=0.0)


def test_loop_round_keeps_target_distribution():
    """Real target p and a real drafter's q (partial draft vocab, temperature + top-p on both):
    the first token emitted by `sample_chain` is distributed as p."""
    target = tiny_llama(hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=5)
    V = target.config.vocab_size
    torch.manual_seed(0)
    draft_targets = torch.arange(0, V, 2)
    cfg = DrafterConfig.from_target(target.config, draft_vocab_size=len(draft_targets), aux_layer_ids=[0, 1, 2])
    drafter = Eagle3Drafter(cfg)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_targets] = True
    drafter.init_from_target(target, draft_targets - torch.arange(len(draft_targets)), t2d)
    with torch.no_grad():   # make the drafter's distribution close-ish to the target's so both branches occur
        drafter.lm_head.weight.mul_(0.3)
    sampling = Sampling(temperature=1.5, top_p=0.95, seed=0)
    prompt = [5, 9, 33, 7, 100]

    proposer = EagleProposer(drafter, k=1)
    captured = {}
    original = proposer.propose

    def spy(tokens, budget, s, g):
        draft = original(tokens, budget, s, g)
        captured.setdefault("q", draft.q[0])
        captured.setdefault("context", list(tokens))
        return draft

    proposer.propose = spy
    generate(target, prompt, proposer, max_new_tokens=3, sampling=sampling, eos_token_ids=set())
    q = captured["q"]                                                     # [V], zero off the draft vocab
    assert float(q[~t2d].sum()) == 0.0 and abs(float(q.sum()) - 1) < 1e-5

    # p at the same position: the target after prompt + the first (sampled) token
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        logits = target(torch.tensor([captured["context"]])).logits[0, -1]
    p = probabilities(logits, sampling)
    n = 6000
    counts = torch.zeros(V)
    accepted = 0
    for _ in range(n):
        x = sample(q, g)
        path, bonus = sample_chain(Draft.chain([x], [q]), torch.stack([logits, logits]), sampling, g)
        accepted += len(path) == 2
        counts[x if len(path) == 2 else bonus] += 1
    assert 0.05 * n < accepted < 0.95 * n      # both branches (accept, resample) are exercised
    bound = tv_bound(p, n)
    assert tv(counts, p) < bound
    assert tv(q * n, p) > 2 * bound


def test_sampled_generation_is_seeded():
    target = tiny_llama(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=2)
    cfg = DrafterConfig.from_target(target.config, draft_vocab_size=target.config.vocab_size, aux_layer_ids=[0, 1, 1])
    drafter = Eagle3Drafter(cfg)
    V = target.config.vocab_size
    drafter.init_from_target(target, torch.zeros(V, dtype=torch.long), torch.ones(V, dtype=torch.bool))
    run = lambda seed: generate(target, [4, 5, 6], EagleProposer(drafter.eval(), k=3), max_new_tokens=20,
                                sampling=Sampling(temperature=1.0, seed=seed), eos_token_ids=set()).token_ids
    a, b, c = run(1), run(1), run(2)
    assert a == b and len(a) == 20 and a != c
