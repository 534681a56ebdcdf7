"""P-EAGLE (parallel EAGLE): EAGLE-3's drafter that drafts all K tokens of a round in one forward.

The last accepted position drafts token 1 as in EAGLE-3; K-1 mask slots after it (the mask token,
with fc(mask_hidden), a learned aux-width vector, as their hidden state) draft tokens 2..K. Trained
by the TTT unroll with every later step a mask slot (model/eagle3/objective.py, parallel=True),
served by vLLM from `speculators_model_type: "peagle"` (PeagleLlamaForCausalLM with
`parallel_drafting`). module.py the config and nn.Module · proposer.py the one-forward chain ·
checkpoint.py config.json and tensors.
"""

from __future__ import annotations

from specdraft.errors import SpecdraftError
from specdraft.families import Family, register
from specdraft.model import eagle3
from specdraft.model.peagle import checkpoint
from specdraft.model.common.mask import mask_token_of
from specdraft.model.peagle.module import PeagleConfig, PeagleDrafter
from specdraft.model.peagle.proposer import PeagleProposer


def new_config(target_config, draft_vocab_size: int, aux_layer_ids: list[int], verifier: str = "", run=None):
    if run is not None and run.fc_norm:
        # vLLM 0.32's update_peagle carries norm_before_residual and norm_before_fc, not fc_norm: its
        # PeagleLlamaForCausalLM has no fc_norm weights and refuses the checkpoint at load
        raise SpecdraftError("--fc-norm: vLLM serves P-EAGLE without fc_norm (its peagle loader has no such "
                             "weights); train --family peagle with --no-fc-norm")
    base = eagle3.new_config(target_config, draft_vocab_size, aux_layer_ids, verifier, run)
    return PeagleConfig.from_dict({**base.to_dict(), "mask_token_id": mask_token_of(target_config)})


FAMILY = register(Family(model_type="peagle", config_type=PeagleConfig, new_config=new_config, build=PeagleDrafter,
                         init_from_target=eagle3.init_from_target,
                         objective=lambda drafter, teacher, run: eagle3.training_objective(drafter, teacher, run, parallel=True),
                         proposer=PeagleProposer, checkpoint_config=checkpoint.build_config,
                         parse_config=checkpoint.parse_config, validate=checkpoint.validate,
                         fsdp_units=eagle3.fsdp_units, drafts_in_one_forward=True,
                         vllm_speculative=(("method", "eagle3"), ("parallel_drafting", True)),
                         title="P-EAGLE", shape_flags=eagle3.SHAPE_FLAGS))
