"""EAGLE-3 (with the EAGLE-3.1 options): one decoder layer over fc(aux layers) + the token embedding,
trained with training-time test (TTT). Served by vLLM as `speculators_model_type: "eagle3"`.

config.py the drafter's config · module.py the nn.Module · objective.py the TTT training forward ·
proposer.py chain / tree drafting for the generation loop · checkpoint.py the speculators
config.json · tensors.py the tensor names and shapes · sglang.py the SGLang / EAGLE-repo layout.
"""

from __future__ import annotations

from specdraft.errors import SpecdraftError
from specdraft.families import Family, Layout, register
from specdraft.model.eagle3 import checkpoint, sglang, tensors
from specdraft.model.common.config import SHAPE_FLAGS as COMMON_SHAPE_FLAGS
from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.module import Eagle3Drafter
from specdraft.model.eagle3.objective import TTTObjective
from specdraft.model.eagle3.proposer import EagleProposer
from specdraft.targets import last_layer_tensors


def new_config(target_config, draft_vocab_size: int, aux_layer_ids: list[int], verifier: str = "", run=None):
    if run is not None and run.draft_layers != 1:
        raise SpecdraftError(f"--draft-layers {run.draft_layers}: an {run.family} drafter has one decoder layer "
                             "(vLLM serves it so); drop --draft-layers or train --family dflash")
    options = {} if run is None else {"norm_before_residual": run.norm_before_residual, "fc_norm": run.fc_norm,
                                      "norm_output": run.norm_output, "sliding_window": run.sliding_window}
    return DrafterConfig.from_target(target_config, draft_vocab_size=draft_vocab_size, aux_layer_ids=aux_layer_ids,
                                     verifier=verifier, run=run, **options)


def init_from_target(drafter, target, d2t, t2d, run=None) -> None:
    """Embeddings and lm_head rows from the target; the decoder layer too with init_layer=target."""
    drafter.init_from_target(target.model, d2t, t2d)
    if run is not None and run.init_layer == "target":
        drafter.init_layer_from_target(last_layer_tensors(target))


def training_objective(drafter, teacher, run, parallel: bool = False) -> TTTObjective:
    return TTTObjective(drafter, teacher, run.ttt_steps, run.step_decay, run.loss, run.aux_noise, run.attention,
                        "data" if parallel else run.ttt_inputs, parallel=parallel)


def fsdp_units(drafter) -> list:
    """The wide matrices (V x H, nH x H, N x H); the decoder layer stays in the root unit (its KV cache
    must be the same object across TTT steps, and FSDP2 copies dataclass arguments)."""
    return [drafter.embed_tokens, drafter.fc, drafter.lm_head]


def sglang_detect(config: dict, weights) -> str | None:
    if sglang.ARCHITECTURE not in (config.get("architectures") or []):
        return None
    return "eagle" if weights.name == "pytorch_model.bin" else "sglang"     # the official EAGLE repo: .bin


def sglang_read(config: dict, weights: dict, where: str):
    weights = sglang.to_canonical_names(weights)
    lm_head = weights.get("lm_head.weight")
    return weights, sglang.parse_config(config, where, None if lm_head is None else lm_head.shape[0])


def sglang_write(cfg, weights: dict, dtype: str, where: str):
    return sglang.build_config(cfg, dtype, where), sglang.to_sglang_names(weights)


SGLANG = Layout("sglang", sglang_detect, sglang_read, sglang_write, sglang.unsupported,
                "config.json with architectures ['LlamaForCausalLMEagle3'] (SGLang / EAGLE repo)",
                needs=sglang.needs, serve=sglang.serve_command)

# what --from-pretrained keeps: the drafter config fields the train flags set
SHAPE_FLAGS = (("fc_norm", "--fc-norm"), ("norm_output", "--norm-output"),
               ("norm_before_residual", "--norm-before-residual")) + COMMON_SHAPE_FLAGS

FAMILY = register(Family(model_type="eagle3", config_type=DrafterConfig, new_config=new_config, build=Eagle3Drafter,
                         init_from_target=init_from_target, objective=training_objective, proposer=EagleProposer,
                         checkpoint_config=checkpoint.build_config, parse_config=checkpoint.parse_config,
                         validate=tensors.validate, fsdp_units=fsdp_units, layouts=(SGLANG,), tree=True,
                         title="EAGLE-3", shape_flags=SHAPE_FLAGS))
