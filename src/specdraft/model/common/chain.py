"""Drawing a draft chain off a drafter's logits, and the causal mask of a chunk of new positions over
a drafter's cache: what every family's proposer shares."""

from __future__ import annotations

import torch

from specdraft.infer.sampling import Sampling, probabilities, sample
from specdraft.infer.tree import Draft


def causal_chunk_mask(cached: int, new: int, device, window: int = 0) -> torch.Tensor | None:
    """bool [1,1,new,cached+new]: new queries see every cached key and the new keys up to their own
    (None where that is every key). The cache holds positions 0..cached-1 in order, so with a sliding
    `window` (the drafter's config) query position q also stops seeing keys q - window and older, as
    its training mask and a serving engine's sliding window do."""
    if new == 1 and (window <= 0 or cached < window):
        return None
    q = torch.arange(cached, cached + new, device=device)[:, None]                 # [new, 1] positions
    j = torch.arange(cached + new, device=device)[None, :]                         # [1, cached+new]
    seen = j <= q
    if window > 0:
        seen &= (q - j) < window
    return seen[None, None]


def draw_chain(logits: torch.Tensor, advance, k: int, sampling: Sampling, generator: torch.Generator,
               stop: float | None, draft_target_ids: torch.Tensor, vocab_size: int) -> tuple[Draft, bool]:
    """A chain of up to k drafts read off draft-vocab logits [Vd]: `advance(step, target id)` gives the
    next position's logits. Greedy takes the argmax; sampling draws from the drafter's distribution and
    keeps it (q, over target ids) for the rejection rule. `stop` P ends the chain once the product of
    the drafted tokens' probabilities falls below P (the token that crossed it is not drafted).
    -> (the chain, whether the stop cut it)."""
    ids, qs = [], [] if not sampling.greedy else None
    confidence = 1.0
    for step in range(k):
        if sampling.greedy and stop is None:
            draft_id = logits.argmax()
        elif sampling.greedy:
            p, draft_id = torch.softmax(logits.float(), dim=-1).max(dim=-1)
            confidence *= float(p)
        else:
            q_draft = probabilities(logits, sampling)                              # [Vd]
            draft_id = sample(q_draft, generator)
            confidence *= float(q_draft[draft_id])
        if stop is not None and confidence < stop:
            return Draft.chain(torch.stack(ids).tolist() if ids else [], qs), True
        if qs is not None:
            q = torch.zeros(vocab_size, device=q_draft.device)
            qs.append(q.index_copy_(0, draft_target_ids, q_draft))                # [V] target ids
        ids.append(draft_target_ids[draft_id])
        if step + 1 < k:
            logits = advance(step, ids[-1])
    return Draft.chain(torch.stack(ids).tolist() if ids else [], qs), False
