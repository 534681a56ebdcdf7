"""The hybrid proposer (infer/hybrid.py): the drafter's chain and the n-gram continuation in one verify."""

import random

import pytest
import torch

from specdraft.infer.hybrid import HybridProposer, union
from specdraft.infer.ngram import Datastore, NgramProposer, draft_tokens, lookup_match
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import Profile, generate
from specdraft.infer.tree import Draft, greedy_path
from specdraft.model.eagle3.proposer import EagleProposer
from specdraft.testing import tiny_drafter_for, tiny_llama


@pytest.fixture(scope="module")
def target():
    return tiny_llama(hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=3)


@pytest.fixture(scope="module")
def drafter(target):
    return tiny_drafter_for(target, [0, 2, 3], every=3, seed=0).eval()


def hf_greedy(model, prompt, n):
    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         eos_token_id=2, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def repetitive_prompts(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 200) for _ in range(rng.randint(4, 12))] * rng.randint(2, 3) for _ in range(n)]


def test_union_merges_shared_prefixes_and_keeps_parents_first():
    d = union([[5, 6, 7], [5, 6, 9, 10], []])
    assert d.tokens == [5, 6, 7, 9, 10] and d.parents == [0, 1, 2, 2, 4]
    assert all(p <= i for i, p in enumerate(d.parents))
    assert union([[1, 2], [1, 2]]).is_chain and union([[1, 2], [1, 2]]).tokens == [1, 2]
    two = union([[1, 2], [3]])
    assert two.parents == [0, 1, 0] and not two.is_chain
    # the verifier walks whichever branch the target agrees with, to its end
    assert greedy_path(d, [5, 6, 9, 0, 10, 0]) == [0, 1, 2, 4, 5]     # choice is by node
    assert greedy_path(d, [5, 6, 7, 1, 0, 0]) == [0, 1, 2, 3]


def test_union_grafts_a_chain_onto_a_drafters_tree():
    """The tree's nodes keep their numbers; the n-gram chain reuses the branch it shares, then grows its own."""
    tree = Draft([5, 8, 6, 9], [0, 0, 1, 1])                 # root -> 5 -> (6, 9); root -> 8
    d = union([[5, 9, 4]], base=tree)
    assert d.tokens == [5, 8, 6, 9, 4] and d.parents == [0, 0, 1, 1, 4]
    assert union([[8]], base=tree).tokens == tree.tokens     # already there: nothing added
    assert union([[7, 7]], base=tree).parents == [0, 0, 1, 1, 0, 5]
    assert greedy_path(d, [5, 9, 0, 0, 4, 0]) == [0, 1, 4, 5]


def test_lookup_match_reports_the_matched_length():
    assert lookup_match([1, 2, 3, 9, 1, 2, 3], 2) == ([9, 1], 3)
    assert lookup_match([4, 5, 6], 2) == ([], 0)
    assert lookup_match([7, 1, 8, 1], 3) == ([8, 1], 1)


def test_hybrid_greedy_is_lossless_and_never_accepts_less_per_round(target, drafter):
    """Same output as greedy; over a prompt set, at least the tokens per round of either part alone."""
    totals = {"ngram": [0, 0], "eagle3": [0, 0], "hybrid": [0, 0]}
    for i, prompt in enumerate(repetitive_prompts(6, seed=4)):
        ref = hf_greedy(target, prompt, 24)
        for name, proposer in (("ngram", NgramProposer(k=3)), ("eagle3", EagleProposer(drafter, k=2)),
                               ("hybrid", HybridProposer(EagleProposer(drafter, k=2), ngram_k=3))):
            out = generate(target, prompt, proposer, max_new_tokens=24, eos_token_ids={2})
            assert out.token_ids == ref, (i, name)
            totals[name][0] += sum(out.accepted) + len(out.accepted)
            totals[name][1] += len(out.accepted)
    tau = {n: t / r for n, (t, r) in totals.items()}
    assert tau["hybrid"] >= max(tau["ngram"], tau["eagle3"]) - 1e-9, tau
    assert tau["ngram"] > 1.0          # the prompts repeat: the n-gram part has something to find


def test_hybrid_without_a_match_is_the_drafter_alone(target, drafter):
    prompt = list(range(3, 30))        # no token repeats: no n-gram match until the answer repeats one
    inner = EagleProposer(drafter, k=3)
    hybrid = HybridProposer(EagleProposer(drafter, k=3), ngram_k=3)
    hybrid.profile = Profile()
    assert hybrid.inner.profile is hybrid.profile
    hybrid.reset(), inner.reset()
    a = generate(target, prompt, inner, max_new_tokens=8, eos_token_ids={2})
    b = generate(target, prompt, hybrid, max_new_tokens=8, eos_token_ids={2})
    assert a.token_ids == b.token_ids and b.proposed[0] == a.proposed[0] == 3


def test_hybrid_sampling_keeps_chains_and_the_targets_distribution(target, drafter):
    """Sampling verifies chains only: the proposal is one chain, and a seeded run equals itself."""
    prompt = repetitive_prompts(1, seed=2)[0]
    sampling = Sampling(temperature=1.0, seed=0)
    runs = [generate(target, prompt, HybridProposer(EagleProposer(drafter, k=2), ngram_k=3), max_new_tokens=16,
                     sampling=sampling, eos_token_ids=set()).token_ids for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 16
    hybrid = HybridProposer(EagleProposer(drafter, k=2), ngram_k=3, min_match=2)
    hybrid.profile = Profile()
    tokens = prompt + prompt[:3]
    hybrid.reset()
    from specdraft.infer.speculative import TargetRunner
    runner = TargetRunner(target, hybrid.aux_layer_ids, hybrid.profile, rows=1, max_len=len(tokens) + 8)
    _, aux = runner.prefill(tokens[:-1])
    hybrid.observe(aux)
    draft = hybrid.propose(tokens, 8, sampling, sampling.generator(torch.device("cpu")))
    assert draft.is_chain and draft.tokens == lookup_match(tokens, 3)[0]


def test_first_token_of_a_round_keeps_the_targets_distribution_with_hybrid_sampling(target, drafter):
    """Lossless sampling: the first new token's frequency over seeds follows the target's softmax."""
    prompt = repetitive_prompts(1, seed=5)[0]
    with torch.no_grad():
        p = torch.softmax(target(torch.tensor([prompt])).logits[0, -1].float(), -1)
    counts = torch.zeros_like(p)
    n = 300
    for seed in range(n):
        out = generate(target, prompt, HybridProposer(EagleProposer(drafter, k=2), ngram_k=3), max_new_tokens=2,
                       sampling=Sampling(temperature=1.0, seed=seed), eos_token_ids=set())
        counts[out.token_ids[0]] += 1
    top = p.topk(3).indices
    for t in top:
        assert abs(counts[t] / n - p[t]) < 4 * (p[t] * (1 - p[t]) / n) ** 0.5 + 0.01, (int(t), float(p[t]))


# ----------------------------------------------------------------------------- the datastore (bench --datastore)

def test_datastore_drafts_the_targets_most_frequent_continuation_where_the_context_repeats_nothing():
    """The context's own match of 2+ tokens first (answers repeat their context), else the continuation
    the target wrote most often after the context's last 2-4 tokens, else the context's 1-token match."""
    store = Datastore([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5, 6], [7, 8, 9]])
    assert store.lookup([9, 1, 2], 2) == [3, 4]             # (1, 2): 3, 4 twice, 5, 6 once
    assert store.lookup([0, 7, 8], 3) == [9]                 # what the answer had, however short
    assert store.lookup([5, 5], 2) == [] and store.lookup([2], 2) == []   # no 2-token key: nothing
    assert store.depth == 3 and store.lookup([9, 1, 2], 1) == [3]   # built once for the longest k, cut to k
    assert draft_tokens([1, 2, 7, 0, 1, 2], 2, 3, 1, store) == ([7, 0], 2)     # the context's own 2-gram wins
    assert draft_tokens([8, 2, 9, 1, 2], 2, 3, 1, store) == ([3, 4], 2)        # only a 1-gram in the context
    assert draft_tokens([8, 2, 9, 4, 2], 2, 3, 1, store) == ([9, 4], 1)        # the datastore has no (4, 2)
    assert draft_tokens([8, 2, 9, 1, 2], 2, 3, 1, None) == ([9, 1], 1)         # no datastore: as before


def test_datastore_holding_the_answer_drafts_it_and_the_output_stays_greedys(target, drafter):
    """With the target's own answer in the datastore, ngram and hybrid accept far more per round on a
    prompt whose context repeats nothing; the tokens stay transformers' greedy either way."""
    prompt = list(range(40, 64))
    ref = hf_greedy(target, prompt, 24)
    store = Datastore([ref])
    tau = {}
    for name, proposer in (("ngram", NgramProposer(k=3)), ("ngram+store", NgramProposer(k=3, datastore=store)),
                           ("hybrid+store", HybridProposer(EagleProposer(drafter, k=2), ngram_k=3, datastore=store))):
        out = generate(target, prompt, proposer, max_new_tokens=24, eos_token_ids={2})
        assert out.token_ids == ref, name
        tau[name] = (sum(out.accepted) + len(out.accepted)) / len(out.accepted)
    assert tau["ngram+store"] > tau["ngram"] + 1 and tau["hybrid+store"] >= tau["ngram+store"] - 1e-9, tau


def test_datastore_reads_each_assistant_turn_of_prepared_data(tmp_path):
    from specdraft.data.prepared import save_prepared
    from specdraft.errors import SpecdraftError

    rows = {"input_ids": [[1, 2, 3, 4, 5, 6, 7], [8, 9]], "loss_mask": [[0, 1, 1, 0, 0, 1, 1], [0, 0]],
            "messages": ["[]", "[]"]}
    save_prepared(tmp_path / "data", rows, {"source": "test"})
    store = Datastore.from_prepared(tmp_path / "data")
    assert store.answers == [[2, 3], [6, 7]] and store.describe("d") == {"path": "d", "answers": 2, "tokens": 4}
    save_prepared(tmp_path / "none", {**rows, "loss_mask": [[0] * 7, [0, 0]]}, {"source": "test"})
    with pytest.raises(SpecdraftError, match="no assistant tokens in its loss mask"):
        Datastore.from_prepared(tmp_path / "none")
    with pytest.raises(SpecdraftError, match="prepared data folder not found"):
        Datastore.from_prepared(tmp_path / "missing")


def test_datastore_without_ngram_or_hybrid_is_refused_before_any_load():
    from specdraft.errors import SpecdraftError
    from specdraft.infer.bench import run_bench

    with pytest.raises(SpecdraftError, match="--datastore ws/data: only ngram and hybrid draft from it"):
        run_bench("no/such-model", None, "natural", "greedy,plain", 8, None, None, 1, None, (1, 3), 1, "cpu",
                  "float32", False, datastore="ws/data")


def test_the_switch_is_one_chain_per_round_lossless_and_drafts_where_the_context_repeats(target, drafter):
    """tree=False: each round one chain, the context's repeat where it matches >= min_match tokens, else
    the drafter's; greedy's tokens, at the chain's rows (max_nodes), n-gram's chain where the prompt repeats."""
    for i, prompt in enumerate(repetitive_prompts(4, seed=7)):
        switch = HybridProposer(EagleProposer(drafter, k=2), ngram_k=3, tree=False)
        assert switch.max_nodes == 3
        out = generate(target, prompt, switch, max_new_tokens=24, eos_token_ids={2})
        assert out.token_ids == hf_greedy(target, prompt, 24), i
    sampling, g = Sampling(), torch.Generator().manual_seed(0)
    for tokens, ngram in (([5, 6, 7, 8, 9, 5, 6], True), (list(range(10, 20)), False)):   # "5 6" repeats; nothing does
        switch.reset()
        switch.observe(torch.zeros(len(tokens) - 1, 3, target.config.hidden_size))    # the prefill's positions
        draft = switch.propose(tokens, 8, sampling, g)
        assert draft.is_chain and (draft.tokens == [7, 8, 9]) == ngram and len(draft.tokens) == 3 - (not ngram)


def test_the_tree_runs_where_the_verify_curve_makes_its_rows_cheap():
    from specdraft.infer.hybrid import tree_pays

    flat = [30.0, 30.5, 31.0, 31.0, 31.2, 31.4, 31.5]                # bf16, compiled: 7 rows as cheap as 4
    steep = [38.5, 38.9, 41.7, 54.9, 56.2, 57.8, 64.9]               # fp32 eager: 7 rows 1.18x 4 rows
    assert tree_pays(flat, 3, 3) and not tree_pays(steep, 3, 3)
    assert tree_pays([40.0], 3, 3)                                   # one time: flat in n


@pytest.mark.parametrize("name", __import__("specdraft.families", fromlist=["names"]).names())
def test_the_switch_is_lossless_with_every_familys_drafter(target, name):
    """The switch drafts with the drafter only in the rounds the context does not repeat, so the drafter
    catches up several rounds' positions at once: every family's proposer must take that and stay lossless."""
    from specdraft.families import family

    fam = family(name)
    drafter = tiny_drafter_for(target, [0, 2, 3], every=3, seed=1, family=name).eval()
    drafted, rounds = 0, 0
    for i, prompt in enumerate(repetitive_prompts(3, seed=11)):
        inner = fam.proposer(drafter, k=2)
        switch = HybridProposer(inner, ngram_k=2, tree=False)
        calls, propose = [], inner.propose
        inner.propose = lambda *a, **kw: calls.append(1) or propose(*a, **kw)
        out = generate(target, prompt, switch, max_new_tokens=24, eos_token_ids={2})
        assert out.token_ids == hf_greedy(target, prompt, 24), (name, i)
        drafted, rounds = drafted + len(calls), rounds + len(out.accepted)
    assert 0 < drafted < rounds          # some rounds the drafter's, some n-gram's (it caught up after those)


def test_hybrid_tree_grafts_ngram_onto_the_drafters_tree_losslessly(target, drafter):
    """bench's hybrid-tree: the drafter's EAGLE-2 tree with the n-gram continuation as one more branch;
    greedy's tokens, never fewer accepted per round in sum than the tree alone on prompts that repeat."""
    from specdraft.infer.methods import HYBRID_TREE, build_methods
    from specdraft.infer.tree import TreeShape

    shape = TreeShape.parse("2,2,4")
    both, alone = build_methods([HYBRID_TREE, "eagle3-tree"], drafter, 2, shape, 3, 1)
    assert both.proposer.inner.tree == shape and both.proposer.max_nodes == shape.total + 2
    tau = {}
    for m in (both, alone):
        accepted = rounds = 0
        for i, prompt in enumerate(repetitive_prompts(4, seed=5)):
            out = generate(target, prompt, m.proposer, max_new_tokens=24, eos_token_ids={2})
            assert out.token_ids == hf_greedy(target, prompt, 24), (m.name, i)
            accepted, rounds = accepted + sum(out.accepted), rounds + len(out.accepted)
        tau[m.name] = (accepted + rounds) / rounds
    assert tau[HYBRID_TREE] > tau["eagle3-tree"], tau


def test_hybrid_tree_needs_a_family_that_drafts_trees(target):
    from specdraft.errors import SpecdraftError
    from specdraft.families import family, names
    from specdraft.infer.methods import HYBRID_TREE, all_methods, check_drafter_methods

    assert HYBRID_TREE in all_methods()
    chain_only = next(n for n in names() if not family(n).tree)
    drafter = tiny_drafter_for(target, [0, 2, 3], every=3, seed=1, family=chain_only)
    with pytest.raises(SpecdraftError, match=f"--methods {HYBRID_TREE}: the --drafter is a {chain_only} drafter, "
                                             "which drafts no tree; name it --methods hybrid"):
        check_drafter_methods([HYBRID_TREE], drafter)
