"""The hybrid proposer: a drafter's chain and the context's n-gram continuation in one verify.

Answers repeat their own context (names, numbers, code, lists), and there prompt lookup's later
positions are accepted far more often than a drafter's trained on little data; elsewhere the drafter
wins. Greedy decoding sends both proposals to the verifier as one small tree (a shared prefix is one
branch), so a round accepts the longer agreeing path: per round never less than either part alone, for
at most K_ngram extra verify rows. Sampling verifies chains only (sample_chain), so there a round
takes the n-gram continuation where the context repeats its last `min_match` tokens and the drafter's
chain elsewhere. The output is the target's own either way: only what is proposed changes. With a
datastore (infer/ngram.py) the greedy n-gram branch also drafts the target's most frequent continuation
where the context repeats nothing; sampling keeps the context's own repeats (a datastore match would
displace the drafter's chain almost everywhere).
"""

from __future__ import annotations

import torch

from specdraft.infer.ngram import Datastore, draft_tokens
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import Profile
from specdraft.infer.tree import Draft

HYBRID = "hybrid"


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
    in step whichever branch the target took); `ngram_k` tokens of prompt lookup go beside its drafts."""

    def __init__(self, inner, ngram_k: int = 3, ngram_max: int = 3, ngram_min: int = 1, min_match: int = 2,
                 datastore: Datastore | None = None):
        self.inner = inner
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
        """The drafter's nodes plus a full n-gram branch beside them (a shared prefix needs fewer)."""
        return self.inner.max_nodes + self.ngram_k

    @property
    def drafts_cut(self) -> int:
        return getattr(self.inner, "drafts_cut", 0)

    def reset(self) -> None:
        self.inner.reset()

    def observe(self, aux: torch.Tensor | None) -> None:
        self.inner.observe(aux)

    def propose(self, tokens: list[int], budget: int, sampling: Sampling,
                generator: torch.Generator) -> Draft:
        drafted = self.inner.propose(tokens, budget, sampling, generator)
        with self.profile.timed("draft_s"):      # sampling: the context's own repeat only, never the datastore's
            store = self.datastore if sampling.greedy else None
            repeat, n = draft_tokens(tokens, min(self.ngram_k, budget), self.ngram_max, self.ngram_min, store)
        if not repeat:
            return drafted
        if not sampling.greedy:
            return Draft.chain(repeat) if n >= self.min_match else drafted
        return union([repeat], base=drafted)        # the drafter's chain or tree, the n-gram branch grafted on
