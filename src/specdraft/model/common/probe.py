"""The draft-cost probe of a family that drafts a round in one forward (Family.drafts_in_one_forward): what
`-k auto` and `plan` time as its draft cost, through the proposer's own loop path."""

from __future__ import annotations

from typing import Callable

import torch

from specdraft.infer.sampling import Sampling


def one_forward_probe(proposer, n_aux: int, hidden_size: int, context: int, k: int) -> Callable[[], None]:
    """A callable running the shortest round on a drafter cache of `context` positions: one new position
    to catch up, then the K = k forward; the cache is cropped back after each call. Random aux states:
    the cost does not depend on them."""
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(context + 1, n_aux, hidden_size, generator=g).to(proposer.param.device, proposer.param.dtype)
    tokens = [0] * (context + 2)
    proposer.observe(aux[:context])
    proposer.propose(tokens[:context + 1], k, Sampling(), g)          # the context, into the drafter's cache

    def round_():
        proposer.observe(aux[context:])
        proposer.propose(tokens, k, Sampling(), g)
        proposer.cache.crop(context)
    return round_
