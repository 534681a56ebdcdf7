"""P-EAGLE (parallel EAGLE): EAGLE-3's drafter that drafts all K tokens of a round in one forward.

The last accepted position drafts token 1 as in EAGLE-3; K-1 mask slots after it (the mask token,
with fc(mask_hidden), a learned aux-width vector, as their hidden state) draft tokens 2..K. Trained
by the TTT unroll with every later step a mask slot (model/eagle3/objective.py, parallel=True),
served by vLLM from `speculators_model_type: "peagle"` (PeagleLlamaForCausalLM with
`parallel_drafting`). module.py the config and nn.Module · proposer.py the one-forward chain ·
checkpoint.py config.json and tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdraft.errors import SpecdraftError
from specdraft.families import Family, register
from specdraft.model import eagle3
from specdraft.model.peagle import checkpoint
from specdraft.model.common.mask import mask_token_of
from specdraft.model.eagle3.objective import TTTObjective
from specdraft.model.peagle.module import PeagleConfig, PeagleDrafter
from specdraft.model.peagle.proposer import PeagleProposer

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig

    from specdraft.infer.tree import TreeShape
    from specdraft.targets import Target
    from specdraft.train.config import RunConfig
    from specdraft.train.objective import TeacherHead


class Peagle(Family[PeagleConfig, PeagleDrafter]):
    """P-EAGLE: EAGLE-3's drafter with mask slots that draft a round's K tokens in one forward (trained by
    the TTT unroll with parallel=True); its config checks, target init, FSDP units and shape flags are EAGLE-3's."""

    model_type = "peagle"
    config_type = PeagleConfig
    drafts_in_one_forward = True
    vllm_speculative = (("method", "eagle3"), ("parallel_drafting", True))
    title = "P-EAGLE"
    shape_flags = eagle3.SHAPE_FLAGS

    def new_config(self, target_config: PretrainedConfig, draft_vocab_size: int, aux_layer_ids: list[int],
                   verifier: str = "", run: RunConfig | None = None) -> PeagleConfig:
        if run is not None and run.fc_norm:
            # vLLM 0.32's update_peagle carries norm_before_residual and norm_before_fc, not fc_norm: its
            # PeagleLlamaForCausalLM has no fc_norm weights and refuses the checkpoint at load
            raise SpecdraftError("--fc-norm: vLLM serves P-EAGLE without fc_norm (its peagle loader has no such "
                                 "weights); train --family peagle with --no-fc-norm")
        base = eagle3.FAMILY.new_config(target_config, draft_vocab_size, aux_layer_ids, verifier, run)
        return PeagleConfig.from_dict({**base.to_dict(), "mask_token_id": mask_token_of(target_config)})

    def build(self, cfg: PeagleConfig) -> PeagleDrafter:
        return PeagleDrafter(cfg)

    def init_from_target(self, drafter: PeagleDrafter, target: Target, d2t: torch.Tensor, t2d: torch.Tensor,
                         run: RunConfig | None = None) -> None:
        eagle3.FAMILY.init_from_target(drafter, target, d2t, t2d, run)

    def objective(self, drafter: PeagleDrafter, teacher: TeacherHead, run: RunConfig) -> TTTObjective:
        return eagle3.training_objective(drafter, teacher, run, parallel=True)

    def proposer(self, drafter: PeagleDrafter, k: int = 4, tree: TreeShape | None = None,
                 stop: float | None = None) -> PeagleProposer:
        return PeagleProposer(drafter, k, tree, stop)

    def checkpoint_config(self, cfg: PeagleConfig, dtype: str, speculative_tokens: int,
                          verifier_architectures: list[str]) -> dict:
        return checkpoint.build_config(cfg, dtype, speculative_tokens, verifier_architectures)

    def parse_config(self, config: dict, where: str) -> PeagleConfig:
        return checkpoint.parse_config(config, where)

    def validate(self, tensors: dict[str, torch.Tensor], cfg: PeagleConfig, where: str) -> None:
        checkpoint.validate(tensors, cfg, where)

    def fsdp_units(self, drafter: PeagleDrafter) -> list[nn.Module]:
        return eagle3.FAMILY.fsdp_units(drafter)


FAMILY = register(Peagle())
