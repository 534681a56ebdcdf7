"""The EAGLE-3 drafter's configuration: the target's shapes every family shares
(model/common/config.py) plus EAGLE-3's (and 3.1's) layout options."""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.model.common.config import BaseConfig


@dataclass
class DrafterConfig(BaseConfig):
    model_type = "eagle3"                 # the family (families.py); a class attribute, not a field
    norm_before_residual: bool = False    # residual = hidden_norm(h) instead of h
    norm_output: bool = False             # feed post-norm hidden back at TTT step k>0 (EAGLE-3.1)
    fc_norm: bool = False                 # one RMSNorm per aux chunk before fc (EAGLE-3.1)
    sliding_window: int = 0               # attend the last N context positions (0 = the whole context)
