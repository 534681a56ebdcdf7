"""P-EAGLE drafting in the generation loop: one drafter forward per round."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from specdraft.errors import SpecdraftError
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import few_row_matmul
from specdraft.infer.tree import Draft
from specdraft.model.common.chain import causal_chunk_mask
from specdraft.model.common.probe import one_forward_probe
from specdraft.model.eagle3.proposer import EagleProposer


class PeagleProposer(EagleProposer):
    """One forward over the positions the target just accepted and K-1 mask slots after them: the
    last accepted position drafts token 1 (as EAGLE-3's catch-up does), mask slot j token j+1. The
    chain is then read off those K rows (EagleProposer.draft_chain, whose `step` here returns the
    next row instead of running the drafter), and the mask slots leave the drafter's cache."""

    def __init__(self, drafter, k: int = 4, tree=None, stop: float | None = None):
        if tree is not None:
            raise SpecdraftError("--tree: P-EAGLE drafts a chain in one forward; drop --tree (or use an eagle3 drafter)")
        super().__init__(drafter, k=k, stop=stop)
        self.rows: torch.Tensor | None = None     # [K, Vd] this round's logits, row j drafts token j+1
        self.root = 0                             # the last accepted position

    def draft_probe(self, context: int, k: int = 1):
        """One forward drafts the round: its cost at K = k (model/common/probe.py)."""
        cfg = self.drafter.config
        return one_forward_probe(self, cfg.num_aux, cfg.hidden_size, context, k)

    def step(self, target_id: torch.Tensor, hidden: torch.Tensor, position: int):
        return self.rows[position - self.root], hidden

    @torch.no_grad()
    def propose(self, tokens: list[int], budget: int, sampling: Sampling, generator: torch.Generator) -> Draft:
        k = max(min(self.k, budget), 1)
        aux = (self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending)).to(self.param.dtype)
        self.pending = []                                                          # aux [P, n_aux, H]
        start, n, slots = len(self.cache), aux.shape[0], k - 1
        dev = self.param.device
        ids = torch.tensor(tokens[start + 1:start + 1 + n] + [self.drafter.config.mask_token_id] * slots,
                           device=dev).view(1, -1)                                 # [1, P + K - 1]
        rows = few_row_matmul(self.drafter, self.linears, self.mm_flags) if n + slots > 1 else nullcontext()
        with self.profile.timed("draft_s"), rows:
            hidden = torch.cat([self.drafter.combine_aux(aux.flatten(-2)),         # [P, H]
                                self.drafter.mask_slots(slots)])                   # + [K-1, H]
            mask = causal_chunk_mask(start, n + slots, dev, self.window)
            out = self.drafter.decode(ids, hidden[None], self.positions(start, n + slots), mask,
                                      self.cache)[:, n - 1:]                       # [1, K, H]
            self.rows = self.drafter.compute_logits(out)[0]                        # [K, Vd]
        self.cache.crop(start + n)                                                 # the real positions only
        self.root = start + n - 1
        return self.draft_chain(self.rows[0], None, self.root, min(self.k, budget), sampling, generator)
