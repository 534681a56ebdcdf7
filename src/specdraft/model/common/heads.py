"""What a fresh drafter takes from its target, for any family with embed_tokens, d2t, t2d, lm_head and
norm."""

from __future__ import annotations

import torch
from torch import nn

from specdraft.targets import final_norm


@torch.no_grad()
def init_heads_from_target(drafter: nn.Module, target_model, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """Copy the target's embeddings (frozen), the vocab mapping, and start lm_head and the final norm
    from the target's (its rows for the draft tokens), so a fresh drafter already speaks the target's
    output space. Any family with embed_tokens, d2t, t2d, lm_head and norm."""
    drafter.embed_tokens.weight.copy_(target_model.get_input_embeddings().weight.float())
    drafter.d2t.copy_(d2t)
    drafter.t2d.copy_(t2d)
    draft_to_target = torch.arange(len(d2t)) + d2t
    drafter.lm_head.weight.copy_(target_model.get_output_embeddings().weight[draft_to_target].float())
    drafter.norm.weight.copy_(final_norm(target_model)[0].float())
