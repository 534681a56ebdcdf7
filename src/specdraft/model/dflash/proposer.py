"""DFlash drafting in the generation loop: one forward per round drafts the whole chain.

The drafter keeps, per layer, the keys and values of the context (one row per position the target
has in its cache, built from the aux states the loop observes). A round runs the block [root, mask
x K] at positions p..p+K (p = the root's) over that context; slot j's distribution drafts token
p+j. The block's own keys never enter the cache: next round its positions are context.
"""

from __future__ import annotations

import torch

from specdraft.errors import SpecdraftError
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import Profile
from specdraft.infer.tree import Draft
from specdraft.model.dflash.module import DFlashDrafter
from specdraft.model.common.cache import ContextCache
from specdraft.model.common.chain import draw_chain
from specdraft.model.common.probe import one_forward_probe


class DFlashProposer:
    """A chain of up to `k` drafts from one block forward; `stop` P ends the chain once the drafter's
    confidence that it is all accepted (the product of its slot probabilities) falls below P."""

    def __init__(self, drafter: DFlashDrafter, k: int = 4, tree=None, stop: float | None = None):
        if tree is not None:
            raise SpecdraftError("--tree: DFlash drafts a chain in one forward; drop --tree (or use an eagle3 drafter)")
        if stop is not None and not 0.0 <= stop <= 1.0:
            raise SpecdraftError(f"--draft-stop {stop}: must lie in [0, 1] (a probability), or auto")
        if k > drafter.config.block_size - 1:   # the block holds the anchor and block_size - 1 draft slots
            raise SpecdraftError(f"-k {k}: this dflash drafter was trained to draft {drafter.config.block_size - 1} "
                                 f"tokens per round (block_size {drafter.config.block_size}); use -k "
                                 f"{drafter.config.block_size - 1} or less")
        self.drafter = drafter.eval()
        self.k, self.stop = k, stop
        self.aux_layer_ids = list(drafter.config.aux_layer_ids)
        self.profile = Profile()
        self.param = next(drafter.parameters())
        self.draft_target_ids = drafter.draft_to_target(torch.arange(drafter.config.draft_vocab_size,
                                                                     device=self.param.device))
        self.reset()

    @property
    def max_nodes(self) -> int:
        return self.k

    def reset(self) -> None:
        self.cache = ContextCache(len(self.drafter.layers))
        self.pending: list[torch.Tensor] = []     # aux [T, n_aux, H] chunks not yet in the context
        self.drafts_cut = 0

    def draft_probe(self, context: int, k: int = 1):
        """One forward drafts the round: its cost at K = k (model/common/probe.py)."""
        cfg = self.drafter.config
        return one_forward_probe(self, cfg.num_aux, cfg.hidden_size, context, k)

    def observe(self, aux: torch.Tensor | None) -> None:
        self.pending.append(aux)

    def positions(self, start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n, device=self.param.device)[None]     # [1, n]

    def block_logits(self, tokens: list[int], k: int) -> torch.Tensor:
        """Context catch-up, then the block [root, mask x k] -> the k slots' logits [k, Vd]."""
        return self.drafter.compute_logits(self.block_out(tokens, k))[0]           # [k, Vd]

    def block_out(self, tokens: list[int], k: int) -> torch.Tensor:
        """Context catch-up, then the block [root, mask x k] -> the k slots' outputs [1, k, H] (pre-norm)."""
        start = len(self.cache)
        if self.pending:
            aux = (self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending)).to(self.param.dtype)
            self.pending = []                                                      # aux [P, n_aux, H]
            self.cache.append(self.drafter.context_kv(aux[None], self.positions(start, aux.shape[0])))
        root = len(self.cache)                                                     # the root's position
        ids = torch.tensor([tokens[-1]] + [self.drafter.config.mask_token_id] * k,
                           device=self.param.device)[None]                         # [1, k+1]
        out = self.drafter.decode(ids, self.positions(root, k + 1), self.cache.kv(), None)   # [1, k+1, H]
        return out[:, 1:]

    @torch.no_grad()
    def propose(self, tokens: list[int], budget: int, sampling: Sampling, generator: torch.Generator) -> Draft:
        k = max(min(self.k, budget), 1)
        with self.profile.timed("draft_s"):
            logits = self.block_logits(tokens, k)
        draft, cut = draw_chain(logits[0], lambda step, token: logits[step + 1], k, sampling, generator,
                                self.stop, self.draft_target_ids, self.drafter.config.vocab_size)
        self.drafts_cut += cut                             # slot j's distribution does not see drafts < j
        return draft
