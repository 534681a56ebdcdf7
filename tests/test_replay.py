"""benchmarks/replay.py: greedy decoding replayed over the target's answers gives generate()'s rounds."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdraft.infer.hybrid import HybridProposer
from specdraft.infer.ngram import NgramProposer
from specdraft.infer.speculative import generate
from specdraft.infer.tree import TreeShape
from specdraft.model.eagle3.proposer import EagleProposer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from replay import by_category, replay_methods, replay_one  # noqa: E402
from test_hybrid import drafter, repetitive_prompts, target  # noqa: E402, F401  (the tiny target and drafter)


def proposers(drafter):
    return {"eagle3": EagleProposer(drafter, k=3), "tree": EagleProposer(drafter, tree=TreeShape.parse("2,2,4")),
            "ngram": NgramProposer(k=3), "hybrid": HybridProposer(EagleProposer(drafter, k=3), ngram_k=3),
            "hybrid-tree": HybridProposer(EagleProposer(drafter, tree=TreeShape.parse("2,2,4")), ngram_k=3)}


def test_replay_gives_every_rounds_accepted_and_proposed_drafts_as_generate(target, drafter):
    """Chain, tree, n-gram and hybrid: the replay over generate's own output reproduces its rounds exactly,
    from the answer's hidden states computed in one forward (no verify)."""
    methods = proposers(drafter)
    accepted_anywhere = dict.fromkeys(methods, 0)
    for prompt in repetitive_prompts(4, seed=5):
        plain = generate(target, prompt, None, max_new_tokens=20, eos_token_ids=set()).token_ids
        for name, proposer in methods.items():
            out = generate(target, prompt, proposer, max_new_tokens=20, eos_token_ids=set())
            assert out.token_ids == plain, name                                  # lossless, a grafted tree too
            ids = prompt + out.token_ids
            aux = replay_aux(target, ids, proposer.aux_layer_ids)
            accepted, proposed = replay_one(proposer, ids, len(prompt), len(ids), aux)
            assert accepted == out.accepted and proposed == out.proposed, (name, prompt)
            accepted_anywhere[name] += sum(accepted)
    assert accepted_anywhere["ngram"] > 0 and accepted_anywhere["hybrid-tree"] > 0, accepted_anywhere


def replay_aux(target, ids, layer_ids):
    from specdraft.analysis.probe import target_hidden

    return target_hidden(SimpleNamespace(model=target), [ids], list(layer_ids))[0] if layer_ids else None


def test_replay_methods_sums_rounds_over_answers_as_bench_counts_tau(target, drafter):
    """τ = (accepted + rounds) / rounds over every answer, per-prompt τ kept, one entry per method."""
    samples = []
    for prompt in repetitive_prompts(3, seed=7):
        out = generate(target, prompt, None, max_new_tokens=16, eos_token_ids=set())
        samples.append((prompt + out.token_ids, len(prompt), len(prompt) + 16))
    methods = [SimpleNamespace(name=name, proposer=p) for name, p in proposers(drafter).items()]
    seen = []
    rows = replay_methods(SimpleNamespace(model=target), methods, samples, lambda n, taus: seen.append(n))
    assert seen == [1, 2, 3] and set(rows) == {"eagle3", "tree", "ngram", "hybrid", "hybrid-tree"}
    for name, row in rows.items():
        # 16 new tokens per answer: the prefill's first one, then 15 over the rounds
        assert row["tau"] * row["rounds"] == pytest.approx(15 * 3), name
        assert len(row["per_prompt_tau"]) == 3 and 1.0 <= row["tau"] <= 4.0


def test_by_category_averages_each_methods_per_prompt_tau_within_a_category():
    """The per-category table: mean per-prompt τ where the category matches; unlabelled prompts left out."""
    rows = {"eagle3": {"per_prompt_tau": [1.0, 2.0, 3.0, 9.0]}, "ngram": {"per_prompt_tau": [2.0, 2.0, 1.0, 9.0]}}
    table = by_category(rows, ["math", "math", "coding", ""])
    assert table[0] == "| method | math | coding |"
    assert table[2:] == ["| eagle3 | 1.50 | 3.00 |", "| ngram | 2.00 | 1.00 |"]
    assert by_category(rows, ["", "", "", ""]) == []
