"""DSpark drafting in the generation loop: DFlash's one block forward per round, then the chain read
off the slots left to right, each slot's logits biased by the Markov head of the token before it
(the root for slot 1, the draft of slot j-1 for slot j), as vLLM's DSparkSpeculator samples.

The confidence stop (`stop` P, `--draft-stop`): the confidence head estimates, per slot, that its
draft is accepted given the drafts before it; the chain keeps the longest prefix whose cumulative
estimated survival (the product of those estimates) stays >= P. A slot's estimate reads its block
output and the token before it, never its own draft, so cutting the drawn chain there is the same
as stopping the draw. A drafter without a confidence head falls back to DFlash's stop (the product
of its own probabilities of the drafted tokens). Only the draft's length changes, never the output.
"""

from __future__ import annotations

import torch

from specdraft.infer.sampling import Sampling
from specdraft.infer.tree import Draft
from specdraft.model.dflash.proposer import DFlashProposer
from specdraft.model.dspark.module import DSparkDrafter
from specdraft.model.common.chain import draw_chain


class DSparkProposer(DFlashProposer):
    def __init__(self, drafter: DSparkDrafter, k: int = 4, tree=None, stop: float | None = None):
        super().__init__(drafter, k=k, tree=tree, stop=stop)
        self.survival: list[float] = []           # the last round's cumulative estimates, slot by slot

    def survival_of(self, normed: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """normed [n, H], the tokens before each slot [n] -> cumulative estimated survival [n]."""
        estimate = torch.sigmoid(self.drafter.confidence_logit(normed, self.drafter.markov_embed(prev_ids)))
        return estimate.cumprod(0)

    @torch.no_grad()
    def propose(self, tokens: list[int], budget: int, sampling: Sampling, generator: torch.Generator) -> Draft:
        k = max(min(self.k, budget), 1)
        with self.profile.timed("draft_s"):
            out = self.block_out(tokens, k)[0]                                     # [k, H]
        root = torch.tensor(tokens[-1], device=self.param.device)

        def logits_at(step: int, prev: torch.Tensor) -> torch.Tensor:             # slot step+1 after `prev`
            return self.drafter.slot_logits(out[step:step + 1], None, prev.view(1))[0]
        heads = self.drafter.confidence_head is not None
        draft, cut = draw_chain(logits_at(0, root), lambda step, token: logits_at(step + 1, token), k, sampling,
                                generator, None if heads else self.stop, self.draft_target_ids,
                                self.drafter.config.vocab_size)
        if heads and draft.tokens:
            n = len(draft.tokens)
            prev = torch.tensor([tokens[-1]] + draft.tokens[:-1], device=self.param.device)   # [n]
            survival = self.survival_of(self.drafter.norm(out[:n]), prev)
            self.survival = survival.tolist()
            if self.stop is not None:
                keep = int((survival >= self.stop).long().cumprod(0).sum())
                if keep < n:
                    draft, cut = Draft.chain(draft.tokens[:keep], draft.q[:keep] if draft.q else None), True
        self.drafts_cut += cut
        return draft
