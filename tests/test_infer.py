"""Speculative generation is lossless: chain, tree and n-gram drafting return exactly the tokens
of plain greedy decoding (transformers generate), with rejections at every depth."""

import copy
import json
import random

import pytest
import torch

from specdraft.errors import SpecdraftError
from specdraft.infer.methods import check_drafter_fits
from specdraft.infer.tree import TreeShape
from specdraft.model.eagle3.proposer import EagleProposer
from specdraft.infer.ngram import NgramProposer, lookup
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import (Profile, TargetRunner, cache_kwarg, few_row_matmul, generate,
                                        per_position_accept)
from specdraft.infer.tree import Draft, ancestor_mask
from specdraft.model.eagle3.module import DynamicCache, causal_mask
from specdraft.testing import tiny_drafter_for, tiny_llama

AUX = [0, 2, 3]   # includes 0 = the embeddings


@pytest.fixture(scope="module")
def target():
    return tiny_llama(hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=3)


@pytest.fixture(scope="module")
def drafter(target):
    """Random drafter over a partial draft vocab (every 3rd target id), so d2t offsets are non-zero."""
    return tiny_drafter_for(target, AUX, every=3, seed=0).eval()


def hf_greedy(model, prompt, n):
    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         eos_token_id=2, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts(n, seed=0, length=(4, 20)):
    rng = random.Random(seed)
    # repeated fragments give the n-gram proposer something to find
    return [[rng.randrange(3, 200) for _ in range(rng.randint(*length))] * rng.randint(1, 2) for _ in range(n)]


class OracleChain:
    """Knows the greedy answer and proposes it with some tokens corrupted: acceptance of every
    length 0..K happens, so rollback is exercised all the time."""

    aux_layer_ids = None

    def __init__(self, prompt, answer, k, wrong=0.3, seed=0):
        self.full, self.start, self.k, self.wrong = prompt + answer, len(prompt), k, wrong
        self.rng = random.Random(seed)
        self.profile = Profile()
        self.max_nodes = k

    def reset(self):
        pass

    def observe(self, aux):
        pass

    def guess(self, pos):
        right = self.full[pos] if pos < len(self.full) else 5
        return right if self.rng.random() > self.wrong else (right + 1 + self.rng.randrange(50)) % 263

    def propose(self, tokens, budget, sampling, generator):
        assert tokens == self.full[:len(tokens)], "the loop's tokens drifted from greedy"
        return Draft.chain([self.guess(len(tokens) + i) for i in range(min(self.k, budget))])


class OracleTree(OracleChain):
    """A random tree whose nodes are siblings of guesses: the right path, when present, sits at a
    random child index, so the cache must be gathered (not just cropped)."""

    def __init__(self, prompt, answer, k, wrong=0.3, seed=0):
        super().__init__(prompt, answer, k, wrong, seed)
        self.max_nodes = 6 * k       # up to 2 frontier nodes x 3 children per depth

    def propose(self, tokens, budget, sampling, generator):
        assert tokens == self.full[:len(tokens)]
        toks, parents = [], []
        frontier = [0]
        for depth in range(min(self.k, budget)):
            pos = len(tokens) + depth
            new = []
            for parent in frontier:
                width = self.rng.randint(1, 3)
                guesses = {self.guess(pos) for _ in range(width)}
                for g in guesses:
                    toks.append(g)
                    parents.append(parent)
                    new.append(len(toks))
            frontier = self.rng.sample(new, min(len(new), 2))
        return Draft(toks, parents)


def test_tree_mask_equals_running_each_path(target):
    """The runner's per-row mask + tree position ids gives every node the logits of its own path, and
    the pad rows after the nodes change nothing."""
    prompt = [5, 9, 33, 7, 100, 41]
    draft = Draft(tokens=[10, 11, 12, 13, 14], parents=[0, 0, 1, 2, 1])
    for rows in (6, 9):
        runner = TargetRunner(target, None, Profile(), rows=rows, max_len=32)
        runner.prefill(prompt[:-1])
        logits, _ = runner.verify([prompt[-1]] + draft.tokens, [5 + d for d in draft.depths()],
                                  ancestor_mask(draft.parents))
        assert logits.shape[0] == 6 and runner.cache_len() == 5 + rows
        for node in range(len(draft.tokens) + 1):
            path, n = [], node
            while n > 0:
                path.append(draft.tokens[n - 1])
                n = draft.parents[n - 1]
            ref = target(torch.tensor([prompt + path[::-1]])).logits[0, -1]
            torch.testing.assert_close(logits[node], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("use_mm", [False, True])
def test_few_row_matmul_matches_linear_and_restores(bias, use_mm):
    """Whichever kernel the measured table picks (forced here), the output is F.linear's; inside the block a
    module wrapper stands in for the Linear (no method of it patched), and the model is left as it was."""
    layer = torch.nn.Linear(24, 40, bias=bias)
    model = torch.nn.Sequential(layer)
    for rows in (1, 2, 5, 32, 33):
        x = torch.randn(1, rows, 24)
        with few_row_matmul(model, [layer], [(use_mm,) * 33]):
            assert type(model[0]).__name__ == "MeasuredLinear" and model[0].linear is layer
            assert model[0].weight is layer.weight and model[0].out_features == 40   # read mid-forward (P-EAGLE's fc)
            got = model(x)
        assert got.shape == (1, rows, 40) and got.is_contiguous()
        torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias))
        assert model[0] is layer and not vars(layer).keys() & {"forward", "_use_mm"}   # the model as it was
    with few_row_matmul(model):            # no flags given: measured for this machine, same output
        torch.testing.assert_close(model(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_keep_gathers_the_accepted_path(target):
    prompt = [5, 9, 33, 7, 100, 41]
    runner = TargetRunner(target, None, Profile(), rows=6, max_len=32)
    runner.prefill(prompt[:-1])
    draft = Draft(tokens=[10, 11, 12, 13, 14], parents=[0, 0, 1, 2, 4])
    runner.verify([prompt[-1]] + draft.tokens, [5 + d for d in draft.depths()], ancestor_mask(draft.parents))
    runner.keep(5, [0, 2, 4, 5])                       # root -> 11 -> 13 -> 14
    fresh = TargetRunner(target, None, Profile(), rows=6, max_len=32)
    fresh.prefill(prompt + [11, 13, 14])
    assert runner.cache_len() == 9
    for a, b in zip(runner.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(a.keys[:, :, :9], b.keys[:, :, :9], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(a.values[:, :, :9], b.values[:, :, :9], atol=1e-5, rtol=1e-4)


def test_greedy_lossless_chain_tree_ngram(target, drafter):
    cases = prompts(6, seed=1)
    for i, prompt in enumerate(cases):
        ref = hf_greedy(target, prompt, 24)
        proposers = [None, NgramProposer(k=3, ngram_max=3), EagleProposer(drafter, k=1 + i % 5),
                     EagleProposer(drafter, tree=TreeShape(3, 2 + i % 3, 4 + 2 * i))]
        for proposer in proposers:
            out = generate(target, prompt, proposer, max_new_tokens=24, eos_token_ids={2})
            assert out.token_ids == ref, (i, type(proposer).__name__)


def test_the_runners_speed_layers_switch_off_and_keep_the_tokens(target, monkeypatch):
    """Issue 58: TargetRunner is an exact core with speed layers on it. On (the default), every verify round runs
    R rows with the measured kernels' wrappers in the model; with pad_rows and kernels off, a round runs only its
    own rows through plain nn.Linear, and the greedy tokens are the same."""
    from specdraft.infer import speculative

    monkeypatch.setattr(speculative, "mm_flags", lambda linears, timer=None: [(True,) * 33 for _ in linears])
    rounds = []

    def seen(model, args, kwargs):
        wrapped = any(type(m).__name__ == "MeasuredLinear" for m in model.modules())
        rounds.append((kwargs["input_ids"].shape[1], wrapped))

    hook = target.register_forward_pre_hook(seen, with_kwargs=True)
    try:
        for prompt in prompts(3, seed=3):
            ref = hf_greedy(target, prompt, 24)
            for layers in ({}, {"pad_rows": False, "kernels": False}):
                rounds.clear()
                out = generate(target, prompt, NgramProposer(k=3), max_new_tokens=24, eos_token_ids={2}, **layers)
                assert out.token_ids == ref, layers
                verify = rounds[1:]                                      # after the prefill
                if layers:
                    assert not any(w for _, w in verify) and {n for n, _ in verify} != {4}
                else:
                    assert all(w for _, w in verify) and {n for n, _ in verify} == {4}
    finally:
        hook.remove()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["linear", "mm"])
def test_greedy_lossless_on_every_kernel_path_and_dtype(target, drafter, dtype, path, monkeypatch):
    """Whichever kernel the measured table picks (each forced here at every row count), in fp32 and in
    bf16: chain and tree outputs equal transformers' greedy generate of the same target in the same dtype."""
    import copy

    from specdraft.infer import speculative
    from specdraft.model.eagle3 import proposer as eagle

    flags = lambda linears, timer=None: [(path == "mm",) * 33 for _ in linears]   # noqa: E731 (1 row runs as 2)
    monkeypatch.setattr(speculative, "mm_flags", flags)
    monkeypatch.setattr(eagle, "mm_flags", flags)
    model, draft = copy.deepcopy(target).to(dtype), copy.deepcopy(drafter).to(dtype)
    for i, prompt in enumerate(prompts(4, seed=7)):
        ref = hf_greedy(model, prompt, 24)
        for proposer in (EagleProposer(draft, k=2 + i % 3), EagleProposer(draft, tree=TreeShape(3, 2, 6))):
            out = generate(model, prompt, proposer, max_new_tokens=24, eos_token_ids={2})
            assert out.token_ids == ref, (i, dtype, path, proposer.tree)


def test_a_divergence_from_greedy_is_located_and_sized_against_the_targets_own_logits(target):
    """bench's check when a method's tokens leave greedy's: where, and whether the target's own top
    logits tie there within rounding (bf16 verify kernels) or not (a real loss of losslessness)."""
    from specdraft.infer.bench_output import divergence, divergence_line

    prompt = prompts(1, seed=3)[0]
    ref = hf_greedy(target, prompt, 12)
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([prompt + ref[:5]])).logits[0, -1]
    other = int(logits.topk(2).indices[1])                       # the runner-up at position 5
    row = divergence(target, prompt, ref, ref[:5] + [other] + ref[6:])
    assert (row["position"], row["greedy_token"], row["token"]) == (5, ref[5], other)
    assert row["logit_gap"] == pytest.approx(float(logits[ref[5]] - logits[other]), abs=1e-4) and row["logit_gap"] > 0
    step = torch.finfo(torch.float32).eps * max(abs(float(logits[ref[5]])), abs(float(logits[other])), 1.0)
    assert row["steps"] == pytest.approx(row["logit_gap"] / step, rel=1e-3)
    assert row["near_tie"] is (row["steps"] <= 4)
    assert divergence(target, prompt, ref, ref[:7])["near_tie"] is False              # stopped early: no gap
    tie = {"position": 5, "logit_gap": 0.01, "steps": 1.3, "near_tie": True}
    real = {"position": 9, "logit_gap": 2.5, "steps": 300.0, "near_tie": False}
    line = divergence_line("eagle3", {"divergences": [tie]}, 6, "bfloat16")
    assert line.startswith("note: bench: eagle3 matched greedy on 5/6 prompts") and "rounding tie" in line
    line = divergence_line("eagle3", {"divergences": [tie, real]}, 6, "bfloat16")
    assert line.startswith("warning:") and "not a rounding tie" in line and "token 9" in line


@pytest.mark.parametrize("k", [1, 3, 6])
def test_rollback_with_frequent_rejections_stays_greedy(target, k):
    prompt = [17, 4, 99, 23, 8]
    ref = hf_greedy(target, prompt, 150)
    for proposer_cls in (OracleChain, OracleTree):
        proposer = proposer_cls(prompt, ref, k, wrong=0.35, seed=k)
        out = generate(target, prompt, proposer, max_new_tokens=150, eos_token_ids={2})
        assert out.token_ids == ref
        # acceptance of every kind happened: full rejections, partial and (for small k) full accepts
        assert 0 in out.accepted and max(out.accepted) >= min(k, 2)
        assert 1.0 < out.accept_len < k + 1


class RecordingEagle(EagleProposer):
    """Records (last real position, first draft) each round, and lets an oracle override drafts
    so the drafter catches up over chunks of several accepted positions."""

    def __init__(self, drafter, k, answer_full):
        super().__init__(drafter, k=k)
        self.full = answer_full
        self.first_drafts = []
        self.rng = random.Random(0)

    def propose(self, tokens, budget, sampling, generator):
        draft = super().propose(tokens, budget, sampling, generator)
        self.first_drafts.append((len(tokens) - 2, draft.tokens[0]))
        n = self.rng.randint(0, len(draft.tokens))         # oracle: first n drafts right
        right = self.full[len(tokens):len(tokens) + len(draft.tokens)]
        return Draft.chain(right[:n] + draft.tokens[n:len(right)])


def test_drafter_alignment_matches_one_full_pass(target, drafter):
    """Round by round, the drafter's first draft at real position t equals a single causal pass
    over (fc(hidden_states[aux](t)), token t+1) at position ids t: aux hooks, shift and
    positions all line up, and the drafter's KV cache carries no stale drafted entries."""
    prompt = [5, 9, 33, 7, 100, 41, 77]
    ref = hf_greedy(target, prompt, 40)
    full = prompt + ref
    proposer = RecordingEagle(drafter, 3, full)
    out = generate(target, prompt, proposer, max_new_tokens=40, eos_token_ids={2})
    assert out.token_ids == ref
    assert max(out.accepted) >= 2
    with torch.no_grad():
        hs = target(torch.tensor([full]), output_hidden_states=True).hidden_states
        aux = torch.cat([hs[l][0] for l in AUX], dim=-1)[:-1]            # [T-1, 3H], positions 0..T-2
        T = aux.shape[0]
        logits, _ = drafter(torch.tensor([full[1:]]), drafter.combine_aux(aux)[None],
                            torch.arange(T)[None], causal_mask(torch.zeros(1, T, dtype=torch.long)), DynamicCache())
        expected = drafter.draft_to_target(logits[0].argmax(-1))
    assert len(proposer.first_drafts) >= 10
    for t, first in proposer.first_drafts:
        assert first == int(expected[t]), t



class ChainRecorder(EagleProposer):
    """Records each round of the real chain drafting: (tokens so far, the aux rows the drafter has
    seen for positions 0..t, the K drafts)."""

    def __init__(self, drafter, k):
        super().__init__(drafter, k=k)
        self.seen, self.rounds = [], []

    def observe(self, aux):
        self.seen.append(aux)
        super().observe(aux)

    def propose(self, tokens, budget, sampling, generator):
        draft = super().propose(tokens, budget, sampling, generator)
        self.rounds.append((list(tokens), torch.cat(self.seen), draft.tokens))
        return draft


@pytest.mark.parametrize("norm_output", [False, True])
def test_ttt_steps_equal_the_chain_drafts_under_teacher_forcing(target, drafter, norm_output):
    """Train/serve skew guard. In a round at last real position t, the chain feeds its own drafts
    d_0..d_{k-1} at positions t+1..t+k and drafts d_k. Teacher-force ttt_forward with exactly those
    tokens as the ground truth (tokens[:t+2] + drafts) and the aux rows the chain saw: the argmax
    of ttt_forward's step-k logits at position t, as a target id, must be d_k for every k (k>0
    being the unrolled steps: positions, masks, token shift and the fed-back hidden state)."""
    from specdraft.model.eagle3.objective import ttt_forward
    from specdraft.train.objective import TeacherHead

    net = copy.deepcopy(drafter).double()        # float64: no near-tie flips between the two paths
    net.config.norm_output = norm_output
    K = 4
    proposer = ChainRecorder(net, K)
    prompt = [5, 9, 33, 7, 100, 41, 77]
    out = generate(target, prompt, proposer, max_new_tokens=30, eos_token_ids={2})
    assert out.token_ids == hf_greedy(target, prompt, 30)

    step_logits = []                             # what ttt_forward's drafter pass computes, per step
    compute_logits = net.compute_logits
    net.compute_logits = lambda h, rows=None: step_logits.append(compute_logits(h, rows)) or step_logits[-1]
    teacher = TeacherHead(torch.ones(net.config.hidden_size), net.lm_head.weight.detach(), eps=1e-6)
    checked = 0
    for tokens, aux, drafts in proposer.rounds:
        t = len(tokens) - 2                      # last real position; tokens[t+1] is the root
        ids = torch.tensor([tokens + drafts])    # [1, T], T = t+2+K
        T = ids.shape[1]
        aux_rows = torch.zeros(T, *aux.shape[1:], dtype=aux.dtype)
        aux_rows[:t + 1] = aux                   # positions after t never reach position t
        batch = {"input_ids": ids, "aux": aux_rows[None], "last": torch.zeros(1, T, net.config.hidden_size),
                 "loss_mask": torch.ones(1, T), "doc_ids": torch.zeros(1, T, dtype=torch.long),
                 "position_ids": torch.arange(T)[None]}
        step_logits.clear()
        with torch.no_grad():
            ttt_forward(net, teacher, batch, steps=len(drafts))
        for k, draft in enumerate(drafts):       # step k's rows are positions 0..T-k-3, in order
            assert int(net.draft_to_target(step_logits[k][t].argmax())) == draft, (t, k)
            checked += k > 0
    assert len(proposer.rounds) >= 8 and checked >= 2 * len(proposer.rounds)

def test_eos_and_budget(target):
    prompt = [17, 4, 99, 23, 8]
    ref = hf_greedy(target, prompt, 30)
    stop = ref[12]
    first = ref.index(stop)
    out = generate(target, prompt, NgramProposer(4), max_new_tokens=30, eos_token_ids={stop})
    assert out.token_ids == ref[:first + 1]
    out = generate(target, prompt, OracleChain(prompt, ref, 5, wrong=0.0), max_new_tokens=7, eos_token_ids=set())
    assert out.token_ids == ref[:7]
    assert generate(target, prompt, None, max_new_tokens=0).token_ids == []


def test_ngram_lookup():
    assert lookup([1, 2, 3, 4, 1, 2], k=3) == [3, 4, 1]
    assert lookup([1, 2, 3, 9, 2, 3, 7, 2, 3], k=2) == [7, 2]          # most recent match
    assert lookup([1, 2, 3, 4], k=3) == []
    assert lookup([5, 6, 7, 5], k=5, ngram_max=3, ngram_min=1) == [6, 7, 5]
    assert lookup([5, 6, 7, 5], k=5, ngram_max=3, ngram_min=2) == []


def test_per_position_accept():
    assert per_position_accept([0, 2, 1, 3], [3, 3, 3, 3]) == [0.75, 0.5, 0.25]
    assert per_position_accept([], []) == []


def test_drafter_shape_checks(target, drafter):
    assert check_drafter_fits(drafter, target) == []
    other = tiny_llama(hidden_size=48, num_layers=4, num_heads=4, num_kv_heads=2)
    with pytest.raises(SpecdraftError, match="hidden size 32"):
        check_drafter_fits(drafter, other)
    with pytest.raises(SpecdraftError, match="vocab size"):
        check_drafter_fits(drafter, tiny_llama(vocab_size=300, hidden_size=32, num_layers=4))
    with pytest.raises(SpecdraftError, match="aux layer ids"):
        check_drafter_fits(drafter, tiny_llama(hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2))
    with pytest.raises(SpecdraftError, match="--tree"):
        TreeShape.parse("4,4")


def test_tree_refuses_sampling(target, drafter):
    with pytest.raises(SpecdraftError, match="greedy only"):
        generate(target, [5, 6, 7], EagleProposer(drafter, tree=TreeShape(2, 2, 3)), max_new_tokens=8,
                 sampling=Sampling(temperature=1.0))


def test_read_prompts(tmp_path):
    from specdraft.infer.prompts import read_prompts

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "no"}]}) + "\n\n"
                 + json.dumps({"prompt": "plain"}) + "\n")
    assert read_prompts(str(f)) == [[{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
                                    [{"role": "user", "content": "plain"}]]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SpecdraftError, match="no prompts"):
        read_prompts(str(empty))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    with pytest.raises(SpecdraftError, match="bad.jsonl:1"):
        read_prompts(str(bad))


def test_cli_generate_and_bench(tiny_target, tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["generate", "--model", str(tiny_target), "--drafter", "untrained:64", "--method",
                              "eagle3", "--prompt", "hello there", "--max-new-tokens", "12", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(data) == {"text", "token_ids", "tokens_per_s", "accept_len", "new_tokens", "k",   # τ with its K
                         "chat_template_kwargs", "thinking", "datastore"}                    # and its mode
    assert data["datastore"] is None                                   # none given (issue 57: read_by where given)
    assert isinstance(data["k"], int) and data["accept_len"] <= data["k"] + 1
    res = runner.invoke(app, ["generate", "--model", str(tiny_target), "--drafter", "untrained:64", "--method",
                              "eagle3", "-k", "2", "--prompt", "hello there", "--max-new-tokens", "6"])
    assert res.exit_code == 0 and " at K=2 on your prompt (eagle3)" in res.output, res.output
    res = runner.invoke(app, ["generate", "--model", str(tiny_target), "--drafter", "untrained:64", "--method",
                              "hybrid", "--tree", "2,2,3", "--prompt", "hello hello", "--max-new-tokens", "6"])
    assert res.exit_code == 0 and "(hybrid-tree)" in res.output, res.output
    assert data["new_tokens"] == len(data["token_ids"]) > 0

    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"say {w} {w}"}]})
                                      for w in ("one", "two", "three")) + "\n")
    out = tmp_path / "bench.json"
    res = runner.invoke(app, ["bench", "--model", str(tiny_target), "--drafter", "untrained:64", "--prompts",
                              str(prompts_file), "--methods", "greedy,plain,ngram,eagle3,eagle3-tree,hybrid,hybrid-tree",
                              "--max-new-tokens", "16", "--tree", "2,2,3", "-k", "4", "--out", str(out), "--time-split"])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert set(report["methods"]) == {"greedy", "plain", "ngram", "eagle3", "eagle3-tree", "hybrid", "hybrid-tree"}
    for name, m in report["methods"].items():
        assert m["identical_to_greedy"] is True, name
        assert m["tokens_per_s"] > 0 and "speedup" in m
        # plain is specdraft's loop without drafts: what the drafts add is the ratio over it
        plain = report["methods"]["plain"]["tokens_per_s"]
        assert m["speedup_over_plain"] == pytest.approx(m["tokens_per_s"] / plain)
    assert report["methods"]["plain"]["profile"]["draft_s"] == 0 < report["methods"]["plain"]["profile"]["total_s"]
    assert report["methods"]["greedy"]["profile"] is None          # transformers' generate, not our loop
    assert "x plain" in res.output
    assert report["methods"]["eagle3"]["profile"]["total_s"] > 0
    assert report["config"]["num_prompts"] == 3
    assert out.with_suffix(".png").stat().st_size > 1000
    # interleaved rounds (3 by default): the order rotates, every method keeps its per-round samples,
    # speedup is the ratio of medians against greedy from the same rounds
    assert report["rounds"] == 3 and len({tuple(o) for o in report["order"]}) == 3
    assert all(sorted(o) == sorted(report["methods"]) for o in report["order"])
    for name, m in report["methods"].items():
        assert len(m["rounds"]) == 3 and m["same_in_every_round"] is True, name
        tps = [r["tokens_per_s"] for r in m["rounds"]]
        assert m["tokens_per_s"] == sorted(tps)[1] and m["tokens_per_s_spread"]["min"] == min(tps)
        greedy = report["methods"]["greedy"]["tokens_per_s"]
        assert m["speedup"] == pytest.approx(m["tokens_per_s"] / greedy)
        assert m["speedup_spread"]["min"] <= m["speedup_spread"]["max"]
    assert set(report["load"]) == {"start", "end", "cores"} and isinstance(report["warnings"], list)

    # -k auto and the confidence stop: one line with the choice, the output still greedy's
    res = runner.invoke(app, ["bench", "--model", str(tiny_target), "--drafter", "untrained:64", "--prompts",
                              str(prompts_file), "--methods", "greedy,eagle3", "--max-new-tokens", "12",
                              "-k", "auto", "--draft-stop", "auto", "--rounds", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sum("-k auto: K=" in line for line in res.stderr.splitlines()) == 1, res.stderr
    report = json.loads(out.read_text())
    cfg = report["config"]
    assert cfg["k"] == cfg["k_auto"]["k"] >= 0 and cfg["draft_stop"] == cfg["k_auto"]["stop"] and cfg["rounds"] == 2
    assert report["methods"]["eagle3"]["identical_to_greedy"] is True
    assert report["methods"]["eagle3"]["drafts_cut"] >= 0
    res = runner.invoke(app, ["generate", "--model", str(tiny_target), "--drafter", "untrained:64", "--prompt",
                              "hello", "--max-new-tokens", "8", "-k", "auto", "--draft-stop", "0.2", "--json"])
    assert res.exit_code == 0 and "-k auto: K=" in res.stderr, res.output
    # hybrid: any family's drafter and n-gram in one verify; -k auto applies to its drafter's chain
    res = runner.invoke(app, ["generate", "--model", str(tiny_target), "--drafter", "untrained:64", "--method",
                              "hybrid", "--prompt", "say one one one", "--max-new-tokens", "8", "--json"])
    assert res.exit_code == 0 and "-k auto: K=" in res.stderr, res.output


@pytest.mark.integration
def test_smollm2_lossless(smollm2):
    """The embedded SmolLM2 target, 10 prompts x 64 tokens: n-gram and EAGLE-3 (untrained drafter)
    equal transformers' greedy generate token for token."""
    from specdraft.infer.methods import untrained_drafter
    from specdraft.infer.prompts import prompt_ids

    target = smollm2
    drafter = untrained_drafter(target.model, 2048)
    texts = ["What is the capital of France?", "Write a haiku about rain.", "Explain recursion briefly.",
             "List three prime numbers.", "How do plants make food?", "Say hello in Spanish.",
             "What is 12 times 12?", "Name a famous painter.", "Give me a tip for sleeping well.",
             "Why is the sky blue?"]
    eagle = EagleProposer(drafter, k=3)
    ngram = NgramProposer(k=4)
    for i, text in enumerate(texts):
        ids = prompt_ids(target.tokenizer, [{"role": "user", "content": text}])
        ref = hf_greedy_eos(target.model, ids, 64)
        proposer = eagle if i % 2 == 0 else ngram
        out = generate(target.model, ids, proposer, max_new_tokens=64)
        assert out.token_ids == ref, text
    tree = EagleProposer(drafter, tree=TreeShape(3, 2, 6))
    ids = prompt_ids(target.tokenizer, [{"role": "user", "content": texts[0]}])
    assert generate(target.model, ids, tree, max_new_tokens=32).token_ids == hf_greedy_eos(target.model, ids, 32)


def hf_greedy_eos(model, prompt, n):
    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt):].tolist()


# ----------------------------------------------------------------------------- one forward shape (issue 35)

@pytest.fixture(scope="module")
def wide_bf16():
    """A target wide enough that matmuls take blocked kernels, in bf16, where a row's sum order shows."""
    return tiny_llama(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=768,
                      seed=5).to(torch.bfloat16)


def test_a_position_gets_the_same_bits_in_any_row_of_the_round(wide_bf16):
    """Every round runs R rows over all cache slots: the logits of a position are bit-identical whether
    it is plain decoding's one real row or row j of a verify round (the pads and the mask change nothing)."""
    prompt, n, rows = [5, 9, 33, 7, 100, 41, 17], 12, 4
    plain = TargetRunner(wide_bf16, None, Profile(), rows=rows, max_len=64)
    tokens, by_position = [int(plain.prefill(prompt)[0][-1].argmax())], []
    for i in range(n):
        logits, _ = plain.verify([tokens[-1]], [len(prompt) + i])
        plain.keep(len(prompt) + i, [0])
        by_position.append(logits[0])
        tokens.append(int(logits[0].argmax()))
    spec = TargetRunner(wide_bf16, None, Profile(), rows=rows, max_len=64)
    spec.prefill(prompt)
    for start in range(0, n, rows):             # the true continuation as a chain: every row is real
        chunk = tokens[start:start + rows]
        logits, _ = spec.verify(chunk, [len(prompt) + start + j for j in range(len(chunk))])
        spec.keep(len(prompt) + start, list(range(len(chunk))))
        for j in range(len(chunk)):
            assert torch.equal(logits[j], by_position[start + j]), f"position {start + j} (row {j}) differs"


def test_bf16_speculation_equals_plain_decoding_at_the_same_rows(wide_bf16):
    """Lossless in any dtype for a chain: the drafter's chain and n-gram emit this loop's own plain-decoding
    tokens when both run at the same row count R. (A tree's off-branch nodes see their ancestors in other
    slots, so in bf16 they may not: docs/DESIGN.md, measured on SmolLM2.)"""
    drafter = tiny_drafter_for(wide_bf16, [0, 1], every=2, seed=1).to(torch.bfloat16).eval()
    rows = 1 + 4
    for prompt in prompts(3, seed=4):
        plain = generate(wide_bf16, prompt, None, max_new_tokens=20, eos_token_ids=set(), rows=rows).token_ids
        for proposer in (EagleProposer(drafter, k=3), NgramProposer(k=4)):
            out = generate(wide_bf16, prompt, proposer, max_new_tokens=20, eos_token_ids=set(), rows=rows)
            assert out.token_ids == plain, type(proposer).__name__


def test_bench_at_fixed_rows_counts_the_prompts_equal_to_plain(tiny_target, tmp_path):
    """bench --verify-rows R: each method's tokens against plain decoding's at R, per prompt, in the JSON
    and in an '= plain at R' column (issue 35: a tree may leave plain in bf16, so the count is the news)."""
    from typer.testing import CliRunner

    from specdraft.cli import app

    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"say {w}"}]})
                                      for w in ("one", "two")) + "\n")
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, ["bench", "--model", str(tiny_target), "--drafter", "untrained:64", "--prompts",
                                   str(prompts_file), "--methods", "plain,eagle3", "--max-new-tokens", "8", "-k", "3",
                                   "--verify-rows", "6", "--rounds", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    methods = json.loads(out.read_text())["methods"]
    assert methods["eagle3"]["identical_to_plain"] is True and methods["eagle3"]["prompts_identical_to_plain"] == 2
    assert methods["plain"]["prompts_identical_to_plain"] == 2
    assert "= plain" in res.output and "R=6" in res.output       # the column header (rich wraps it)


def test_rows_below_a_round_are_refused(target, drafter):
    with pytest.raises(SpecdraftError, match="--verify-rows 2: a round of this method needs 4 rows"):
        generate(target, [5, 9, 33], EagleProposer(drafter, k=3), max_new_tokens=4, rows=2)


def test_compiled_verify_keeps_the_tokens(target, drafter, wide_bf16):
    """generate(compile=True): verify rounds under torch.compile (one graph per R and cache length, the
    cache rounded up to SLOT_BLOCK slots). fp32: transformers' greedy tokens, drafter or not; bf16: the
    drafter's chain emits compiled plain decoding's tokens at the same R; aux states reach the proposer
    (the chain's acceptance is the eager loop's)."""
    from specdraft.infer.speculative import SLOT_BLOCK

    prompt = [5, 9, 33, 7, 100, 41, 17]
    want = hf_greedy(target, prompt, 16)
    eager = generate(target, prompt, EagleProposer(drafter, k=3), max_new_tokens=16, eos_token_ids={2})
    for proposer in (None, EagleProposer(drafter, k=3)):
        out = generate(target, prompt, proposer, max_new_tokens=16, eos_token_ids={2}, rows=4, compile=True)
        assert out.token_ids == want
    assert out.accepted == eager.accepted                       # the aux hooks fire under compile
    bf16_drafter = tiny_drafter_for(wide_bf16, [0, 1], every=2, seed=1).to(torch.bfloat16).eval()
    plain = generate(wide_bf16, prompt, None, max_new_tokens=20, eos_token_ids=set(), rows=5, compile=True)
    chain = generate(wide_bf16, prompt, EagleProposer(bf16_drafter, k=4), max_new_tokens=20, eos_token_ids=set(),
                     rows=5, compile=True)
    assert chain.token_ids == plain.token_ids
    assert SLOT_BLOCK >= len(prompt) + 20 + 5                   # both rounded to one cache shape


def test_a_compiled_cache_rounds_up():
    """Sliding-window targets are no exception any more: every layer keeps every slot and the masks slide."""
    from specdraft.infer.speculative import SLOT_BLOCK, cache_slots

    assert cache_slots(300, compile=False) == 300
    assert cache_slots(300, compile=True) == SLOT_BLOCK
    assert cache_slots(SLOT_BLOCK + 1, compile=True) == 2 * SLOT_BLOCK


def test_compile_without_a_cpp_compiler_is_one_line(monkeypatch):
    import torch._inductor.cpp_builder as builder

    def missing():
        raise RuntimeError("Unable to find a working g++")
    monkeypatch.setattr(builder, "get_cpp_compiler", missing)
    model = tiny_llama(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=9)
    with pytest.raises(SpecdraftError, match="--compile: torch.compile needs a C\\+\\+ compiler.*install g\\+\\+"):
        generate(model, [5, 9, 33], None, max_new_tokens=4, compile=True)
