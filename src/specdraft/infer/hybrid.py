"""The hybrid proposer: a drafter's chain and the context's n-gram continuation in one verify.

Answers repeat their own context (names, numbers, code, lists), and there prompt lookup's later
positions are accepted far more often than a drafter's trained on little data; elsewhere the drafter
wins. It runs in one of two forms, chosen per machine from the target's verify curve (`tree_pays`):
- the tree (greedy): both proposals go to the verifier as one small tree (a shared prefix is one
  branch), so a round accepts the longer agreeing path: per round never less than either part alone,
  for at most K_ngram extra verify rows. With a datastore (infer/ngram.py) the n-gram branch also
  drafts the target's most frequent continuation where the context repeats nothing.
- the switch: one chain per round, the context's continuation where it repeats its last `min_match`
  tokens, the drafter's chain elsewhere, at the chain's rows (and, being a chain, bit-identical to
  plain decoding at its R in any dtype). The datastore is not consulted: its matches would displace
  the drafter's chain almost everywhere (replayed on the natural set: τ 1.72 with it, 1.79 without).
Sampling verifies chains only (sample_chain), so it always takes the switch. The output is the
target's own either way: only what is proposed changes.
"""

from __future__ import annotations

import torch

from specdraft.infer.ngram import Datastore, draft_tokens
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import Profile
from specdraft.infer.tree import Draft

HYBRID = "hybrid"
TREE_PAYS = 1.05     # the tree where its rows cost at most 5% more than the switch's: replayed on all 96
                     # natural prompts at K=3 it accepted 1.08x the switch's tokens per round (1.93 vs 1.79)


def tree_pays(verify_ms: list[float], k: int, ngram_k: int) -> bool:
    """The tree form where this machine's verify curve (ms at n = 1, 2, ... rows) makes its extra rows
    cheap: verify(1 + k + ngram_k) within TREE_PAYS of the switch's verify(1 + max(k, ngram_k))."""
    from specdraft.infer.costmodel import extend

    tree, switch = 1 + k + ngram_k, 1 + max(k, ngram_k)
    curve = extend(verify_ms, tree)
    return curve[tree - 1] <= TREE_PAYS * curve[switch - 1]


def union(chains: list[list[int]], base: Draft | None = None) -> Draft:
    """One draft tree holding `base` (a chain or a tree; none: the root alone) and every chain from the
    root; a chain that shares a prefix with what is already there shares its nodes. Nodes are numbered
    in creation order, so a parent precedes its children (tree.py's rule)."""
    tokens = list(base.tokens) if base else []
    parents = list(base.parents) if base else []
    node_of = {(p, t): i + 1 for i, (p, t) in enumerate(zip(parents, tokens))}   # (parent node, token) -> node
    for chain in chains:
        node = 0
        for token in chain:
            if (node, token) not in node_of:
                tokens.append(token)
                parents.append(node)
                node_of[(node, token)] = len(tokens)
            node = node_of[(node, token)]
    return Draft(tokens, parents)


class HybridProposer:
    """`inner` is any family's chain or tree proposer (it observes every accepted position, so it stays
    in step whichever branch the target took, and catches up in the round it drafts); `ngram_k` tokens of
    prompt lookup go beside its drafts (`tree`) or instead of them where the context repeats (the switch)."""

    def __init__(self, inner, ngram_k: int = 3, ngram_max: int = 3, ngram_min: int = 1, min_match: int = 2,
                 datastore: Datastore | None = None, tree: bool = True):
        self.inner, self.tree = inner, tree
        self.ngram_k, self.ngram_max, self.ngram_min, self.min_match = ngram_k, ngram_max, ngram_min, min_match
        self.datastore = datastore      # the target's answers: n-gram drafts where the context has no match
        if datastore is not None:
            datastore.table(ngram_k)
        self.aux_layer_ids = inner.aux_layer_ids

    @property
    def profile(self) -> Profile:
        return self.inner.profile

    @profile.setter
    def profile(self, profile: Profile) -> None:
        self.inner.profile = profile

    @property
    def max_nodes(self) -> int:
        """The tree: the drafter's nodes plus a full n-gram branch beside them (a shared prefix needs
        fewer); the switch: the longer of the two chains."""
        if self.tree:
            return self.inner.max_nodes + self.ngram_k
        return max(self.inner.max_nodes, self.ngram_k)

    @property
    def drafts_cut(self) -> int:
        return getattr(self.inner, "drafts_cut", 0)

    def reset(self) -> None:
        self.inner.reset()

    def observe(self, aux: torch.Tensor | None) -> None:
        self.inner.observe(aux)

    def propose(self, tokens: list[int], budget: int, sampling: Sampling,
                generator: torch.Generator) -> Draft:
        if self.tree and sampling.greedy:
            drafted = self.inner.propose(tokens, budget, sampling, generator)
            with self.profile.timed("draft_s"):
                repeat, _ = draft_tokens(tokens, min(self.ngram_k, budget), self.ngram_max, self.ngram_min,
                                         self.datastore)
            return union([repeat], base=drafted) if repeat else drafted   # the n-gram branch grafted on
        with self.profile.timed("draft_s"):          # the switch: the context's own repeat, never the datastore's
            repeat, n = draft_tokens(tokens, min(self.ngram_k, budget), self.ngram_max, self.ngram_min)
        if repeat and n >= self.min_match:
            return Draft.chain(repeat)
        return self.inner.propose(tokens, budget, sampling, generator)
