"""DSpark's config and module: DFlash's parallel block plus two small heads, as vLLM's
Qwen3DSparkForCausalLM (qwen3_dspark.py) serves them.

    block: DFlash's (model/dflash/module.py)      out [B,Q,H], normed = norm(out)
    Markov head (low rank r, position by position within the block):
        e = markov_w1[prev token]                 [.., r]    prev: the token before the drafted one
        logits = lm_head(normed) + markov_w2(e)   [.., Vd]   (the anchor for slot 1, draft j-1 for slot j)
    confidence head: c = sigmoid(proj([normed; e]))     [..]  the estimate that the slot's draft is accepted

markov_w2 starts at zero, so an untrained Markov head leaves DFlash's logits unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specdraft.model.dflash.module import DFlashConfig, DFlashDrafter


@dataclass
class DSparkConfig(DFlashConfig):
    model_type = "dspark"                 # the family (families.py); a class attribute, not a field
    markov_rank: int = 64                 # r: markov_w1 [vocab, r], markov_w2 [draft_vocab, r]
    markov_head_type: str = "vanilla"     # the one vLLM 0.32 serves
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True   # the head reads [normed hidden; Markov embedding]


class MarkovHead(nn.Module):
    """vLLM's names: markov_w1 (an embedding over target ids), markov_w2 (r -> draft vocab)."""

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.markov_w1 = nn.Embedding(cfg.vocab_size, cfg.markov_rank)
        self.markov_w2 = nn.Linear(cfg.markov_rank, cfg.draft_vocab_size, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)


class ConfidenceHead(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        width = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_head_with_markov else 0)
        self.proj = nn.Linear(width, 1, bias=True)


class DSparkDrafter(DFlashDrafter):
    def __init__(self, cfg: DSparkConfig):
        super().__init__(cfg)
        self.markov_head = MarkovHead(cfg)
        self.confidence_head = ConfidenceHead(cfg) if cfg.enable_confidence_head else None

    def markov_embed(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """Target ids [...] -> their Markov embeddings [..., r]."""
        return self.markov_head.markov_w1(prev_ids)

    def slot_logits(self, out: torch.Tensor, rows: torch.Tensor | None, prev_ids: torch.Tensor) -> torch.Tensor:
        """DFlash's slot logits plus the Markov bias of the token before each slot: [R, Vd] at flat
        `rows` of out (or [.., Vd] for every row of out when rows is None, prev_ids then [..])."""
        base = self.compute_logits(out, rows)
        return base + self.markov_head.markov_w2(self.markov_embed(prev_ids).to(base.dtype))

    def confidence_logit(self, normed: torch.Tensor, markov_embed: torch.Tensor) -> torch.Tensor:
        """normed [.., H] (after the final norm), Markov embeddings [.., r] -> logits [..] of the estimate
        that the slot's draft is accepted (fp32, as vLLM runs the head)."""
        x = torch.cat([normed, markov_embed], -1) if self.config.confidence_head_with_markov else normed
        return self.confidence_head.proj(x.float()).squeeze(-1)
