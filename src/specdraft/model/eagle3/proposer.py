"""EAGLE-3 drafting for the verify loop: a chain of K tokens, or an EAGLE-2 style dynamic tree.

Alignment (as in training): the drafter at position t sees fc(aux(t)) and token t+1 and predicts
token t+2, run at position id t. Draft step k>0 feeds the step before's hidden_out (pre-norm) and
the token just drafted, at position t+k. The drafter's cache keeps one entry per real position
(from the target's aux states); drafted entries are appended during a round and cropped after it.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from specdraft.errors import SpecdraftError
from specdraft.infer.sampling import Sampling
from specdraft.kernels import mm_flags, target_linears
from specdraft.infer.speculative import Profile, few_row_matmul
from specdraft.infer.tree import Draft, TreeShape
from specdraft.model.common.cache import GrowingKVCache
from specdraft.model.common.chain import causal_chunk_mask, draw_chain
from specdraft.model.eagle3.module import Eagle3Drafter


class EagleProposer:
    """EAGLE-3 drafting: a chain of up to `k` tokens (optionally cut by a confidence stop), or an
    EAGLE-2 tree. `stop` P: end the chain when the drafter's confidence that the chain so far is
    accepted (the product of its probabilities of the drafted tokens) falls below P; the token that
    crossed it is not drafted. The stop only shortens drafts, so the output never changes."""

    def __init__(self, drafter: Eagle3Drafter, k: int = 4, tree: TreeShape | None = None,
                 stop: float | None = None):
        if stop is not None and not 0.0 <= stop <= 1.0:
            raise SpecdraftError(f"--draft-stop {stop}: must lie in [0, 1] (a probability), or auto")
        self.drafter = drafter.eval()
        self.k = k
        self.tree = tree
        self.stop = stop
        self.aux_layer_ids = list(drafter.config.aux_layer_ids)
        self.profile = Profile()
        self.param = next(drafter.parameters())
        self.linears = target_linears(drafter)
        self.mm_flags = mm_flags(self.linears)
        self.draft_target_ids = drafter.draft_to_target(torch.arange(drafter.config.draft_vocab_size,
                                                                     device=self.param.device))
        self.position_ids = torch.arange(1024, device=self.param.device)[None]  # [1, N], sliced per step
        self.window = int(getattr(drafter.config, "sliding_window", 0) or 0)     # 0: the whole context
        self.reset()

    @property
    def max_nodes(self) -> int:
        """The most nodes a round drafts: the tree's `total`, else the chain's K."""
        return self.tree.total if self.tree is not None else self.k

    def reset(self) -> None:
        self.cache = GrowingKVCache()
        self.pending: list[torch.Tensor] = []     # aux [T,3,H] chunks not yet run through the drafter
        self.drafts_cut = 0                       # chains the confidence stop ended before k

    def observe(self, aux: torch.Tensor | None) -> None:
        self.pending.append(aux)

    def positions(self, start: int, n: int) -> torch.Tensor:
        """[1, n] position ids start..start+n-1: a view of one preallocated arange."""
        if start + n > self.position_ids.shape[1]:
            self.position_ids = torch.arange(2 * (start + n), device=self.param.device)[None]
        return self.position_ids[:, start:start + n]

    def run(self, target_ids: list[int] | torch.Tensor, hidden: torch.Tensor, positions: list[int],
            mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter forward over T tokens (tree nodes): -> logits [T, Vd], hidden_out [T, H]."""
        dev = self.param.device
        ids = torch.as_tensor(target_ids, device=dev).view(1, -1)                  # [1, T]
        pos = torch.tensor([positions], device=dev)                               # [1, T]
        with self.profile.timed("draft_s"):
            logits, hidden_out = self.drafter(ids, hidden.view(1, len(positions), -1), pos, mask, self.cache)
        return logits[0], hidden_out[0]

    def step(self, target_id: torch.Tensor, hidden: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One chain draft step: target id (a tensor, no host round trip), hidden [1, H] at `position`
        -> (logits [Vd], hidden_out [1, H])."""
        with self.profile.timed("draft_s"):
            mask = causal_chunk_mask(position, 1, self.param.device, self.window) if self.window else None
            logits, hidden_out = self.drafter(target_id.view(1, 1), hidden.view(1, 1, -1),
                                              self.positions(position, 1), mask, self.cache)
        return logits[0, -1], hidden_out[0]

    def catch_up(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward (fc, decoder layer, and the final norm and lm_head on the last row only) over
        the positions the target just accepted; the last one predicts the first draft.
        -> (logits [Vd], hidden_out [1, H]) at the last real position t."""
        aux = (self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending)).to(self.param.dtype)
        self.pending = []                                                          # aux [P, n_aux, H]
        start, n = len(self.cache), aux.shape[0]
        ids = torch.tensor(tokens[start + 1:start + 1 + n], device=self.param.device).view(1, -1)   # [1, P]
        rows = few_row_matmul(self.drafter, self.linears, self.mm_flags) if n > 1 else nullcontext()
        with self.profile.timed("draft_s"), rows:
            hidden = self.drafter.combine_aux(aux.flatten(-2))                     # [P, n_aux*H] -> [P, H]
            out = self.drafter.decode(ids, hidden[None], self.positions(start, n),
                                      causal_chunk_mask(start, n, self.param.device, self.window), self.cache)[:, -1:]
            logits = self.drafter.compute_logits(out)                              # [1, 1, Vd]
            hidden_out = self.drafter.feedback(out)
        return logits[0, -1], hidden_out[0]

    def draft_probe(self, context: int, k: int = 1):
        """-k auto's and plan's draft cost (infer.speculative.CostProbed): one chain draft step on a cache
        of `context` positions, cropped back after each call. K steps cost K of these."""
        cfg, dev, dtype = self.drafter.config, self.param.device, self.param.dtype
        g = torch.Generator().manual_seed(0)
        self.reset()
        self.pending = [torch.randn(context, cfg.num_aux, cfg.hidden_size, generator=g).to(dev, dtype)]
        self.catch_up([0] * (context + 1))
        token, hidden = torch.tensor(0, device=dev), torch.randn(1, cfg.hidden_size, generator=g).to(dev, dtype)

        def step():
            self.step(token, hidden, context)
            self.cache.crop(context)
        return step

    @torch.no_grad()
    def propose(self, tokens: list[int], budget: int, sampling: Sampling,
                generator: torch.Generator) -> Draft:
        logits, hidden = self.catch_up(tokens)
        real = len(self.cache)                    # positions 0..real-1 hold real aux states
        try:
            if self.tree is not None:
                return self.draft_tree(logits, hidden, real - 1, min(self.tree.depth, budget))
            return self.draft_chain(logits, hidden, real - 1, min(self.k, budget), sampling, generator)
        finally:
            self.cache.crop(real)

    def draft_chain(self, logits, hidden, t: int, k: int, sampling: Sampling,
                    generator: torch.Generator) -> Draft:
        state = [hidden]

        def advance(step: int, token: torch.Tensor) -> torch.Tensor:
            next_logits, state[0] = self.step(token, state[0], t + step + 1)
            return next_logits
        draft, cut = draw_chain(logits, advance, k, sampling, generator, self.stop, self.draft_target_ids,
                                self.drafter.config.vocab_size)
        self.drafts_cut += cut
        return draft

    def draft_tree(self, logits, hidden, t: int, depth: int) -> Draft:
        """EAGLE-2 dynamic tree (greedy verification). Nodes are kept in creation order, so a
        parent always precedes its children."""
        topk, total = self.tree.topk, self.tree.total
        dev = self.param.device
        node_token: list[int] = []        # target id
        node_parent: list[int] = []       # index into node lists, -1 = root
        node_depth: list[int] = []
        node_score: list[float] = []      # cumulative draft log-prob
        slot_of: dict[int, int] = {}      # node -> its drafted entry in the drafter cache (fed nodes)
        real = t + 1

        lp = torch.log_softmax(logits.float(), dim=-1)
        vals, ids = lp.topk(min(topk, lp.numel()))
        targets = self.draft_target_ids[ids].tolist()
        frontier = []
        for v, tok in zip(vals.tolist(), targets):
            frontier.append(len(node_token))
            node_token.append(tok), node_parent.append(-1), node_depth.append(1), node_score.append(v)
        frontier_hidden = hidden.expand(len(frontier), -1)                         # parents' hidden [F, H]

        for d in range(2, depth + 1):
            fed = len(slot_of)
            n = len(frontier)
            mask = torch.zeros(n, real + fed + n, dtype=torch.bool)                # [F, cache+F]
            mask[:, max(0, t + d - self.window) if self.window else 0:real] = True   # the window: as in training
            for row, node in enumerate(frontier):
                mask[row, real + fed + row] = True
                anc = node_parent[node]
                while anc >= 0:
                    mask[row, real + slot_of[anc]] = True
                    anc = node_parent[anc]
                slot_of[node] = fed + row
            out_logits, out_hidden = self.run([node_token[i] for i in frontier], frontier_hidden,
                                              [t + d - 1] * n, mask.to(dev)[None, None])
            lp = torch.log_softmax(out_logits.float(), dim=-1)                     # [F, Vd]
            vals, ids = lp.topk(min(topk, lp.shape[-1]), dim=-1)                   # [F, k]
            scores = torch.tensor([node_score[i] for i in frontier], device=vals.device)[:, None] + vals
            flat_scores = scores.flatten()
            first_child = len(node_token)
            targets = self.draft_target_ids[ids.flatten()].tolist()
            for j, (s, tok) in enumerate(zip(flat_scores.tolist(), targets)):
                node_token.append(tok), node_parent.append(frontier[j // ids.shape[1]])
                node_depth.append(d), node_score.append(s)
            best = flat_scores.topk(min(topk, flat_scores.numel())).indices
            frontier = [first_child + int(j) for j in best]
            frontier_hidden = out_hidden[best // ids.shape[1]]                     # [F, H]

        # best `total` nodes; stable sort keeps a parent (created first, score >= child's) ahead
        ranked = sorted(range(len(node_token)), key=lambda i: -node_score[i])[:total]
        chosen = sorted(ranked, key=lambda i: (node_depth[i], i))
        index_of = {node: pos + 1 for pos, node in enumerate(chosen)}              # root = 0
        return Draft(tokens=[node_token[i] for i in chosen],
                     parents=[0 if node_parent[i] < 0 else index_of[node_parent[i]] for i in chosen])
