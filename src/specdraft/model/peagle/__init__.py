"""P-EAGLE (parallel EAGLE): EAGLE-3's drafter that drafts all K tokens of a round in one forward.

The last accepted position drafts token 1 as in EAGLE-3; K-1 mask slots after it (the mask token,
with fc(mask_hidden), a learned aux-width vector, as their hidden state) draft tokens 2..K. Trained
by the TTT unroll with every later step a mask slot (model/eagle3/objective.py, parallel=True),
served by vLLM from `speculators_model_type: "peagle"` (PeagleLlamaForCausalLM with
`parallel_drafting`). module.py the config and nn.Module · proposer.py the one-forward chain ·
checkpoint.py config.json and tensors.
"""

from __future__ import annotations

from specdraft.families import Family, register
from specdraft.model import eagle3


def new_config(target_config, draft_vocab_size: int, aux_layer_ids: list[int], verifier: str = "", run=None):
    from specdraft.model.peagle.module import PeagleConfig, mask_token_of

    base = eagle3.new_config(target_config, draft_vocab_size, aux_layer_ids, verifier, run)
    return PeagleConfig.from_dict({**base.to_dict(), "mask_token_id": mask_token_of(target_config)})


def build(cfg):
    from specdraft.model.peagle.module import PeagleDrafter

    return PeagleDrafter(cfg)


def objective(drafter, teacher, run):
    from specdraft.model.eagle3.objective import TTTObjective

    return TTTObjective(drafter, teacher, run.ttt_steps, run.step_decay, run.loss, run.aux_noise, run.attention,
                        "data", parallel=True)


def proposer(drafter, k: int = 4, tree=None, stop: float | None = None):
    from specdraft.model.peagle.proposer import PeagleProposer

    return PeagleProposer(drafter, k=k, tree=tree, stop=stop)


def checkpoint_config(cfg, dtype: str, speculative_tokens: int, verifier_architectures: list[str]) -> dict:
    from specdraft.model.peagle.checkpoint import build_config

    return build_config(cfg, dtype, speculative_tokens, verifier_architectures)


def parse_config(config: dict, where: str):
    from specdraft.model.peagle.checkpoint import parse_config as parse

    return parse(config, where)


def validate(tensors: dict, cfg, where: str) -> None:
    from specdraft.model.peagle.checkpoint import validate as check

    check(tensors, cfg, where)


def _config_type():
    from specdraft.model.peagle.module import PeagleConfig

    return PeagleConfig


FAMILY = register(Family(model_type="peagle", config_type=_config_type(), new_config=new_config, build=build,
                         init_from_target=eagle3.init_from_target, objective=objective, proposer=proposer,
                         checkpoint_config=checkpoint_config, parse_config=parse_config, validate=validate,
                         fsdp_units=lambda drafter: eagle3.fsdp_units(drafter)))
