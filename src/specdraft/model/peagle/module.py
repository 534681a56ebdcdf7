"""P-EAGLE's config and module: EAGLE-3's, plus the mask token and the learned mask hidden state."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.module import Eagle3Drafter


@dataclass
class PeagleConfig(DrafterConfig):
    model_type = "peagle"                 # the family (families.py); a class attribute, not a field
    mask_token_id: int = 0                # target token id in every mask slot (vLLM's pard_token)


class PeagleDrafter(Eagle3Drafter):
    def __init__(self, cfg: PeagleConfig):
        super().__init__(cfg)
        n_aux = cfg.num_aux
        # a mask slot's "aux states" [n_aux * H]: vLLM passes it through fc (and fc_norm) as it does aux
        self.mask_hidden = nn.Parameter(torch.randn(n_aux * cfg.hidden_size) * 0.02)

    def mask_slots(self, n: int) -> torch.Tensor:
        """The hidden input of n mask slots: fc(mask_hidden) [n, H]."""
        return self.combine_aux(self.mask_hidden.to(self.fc.weight.dtype)).expand(n, -1)
