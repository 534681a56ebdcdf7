"""EAGLE-3 (with the EAGLE-3.1 options): one decoder layer over fc(aux layers) + the token embedding,
trained with training-time test (TTT). Served by vLLM as `speculators_model_type: "eagle3"`.

config.py the drafter's config · module.py the nn.Module · objective.py the TTT training forward ·
proposer.py chain / tree drafting for the generation loop · checkpoint.py the speculators
config.json · tensors.py the tensor names and shapes · sglang.py the SGLang / EAGLE-repo layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdraft.errors import SpecdraftError
from specdraft.families import Family, Layout, register
from specdraft.model.eagle3 import checkpoint, sglang
from specdraft.model.common.config import SHAPE_FLAGS as COMMON_SHAPE_FLAGS
from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.module import Eagle3Drafter
from specdraft.model.eagle3.objective import TTTObjective
from specdraft.model.eagle3.proposer import EagleProposer
from specdraft.model.eagle3.tensors import validate as validate_tensors
from specdraft.targets import last_layer_tensors

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig

    from specdraft.infer.tree import TreeShape
    from specdraft.targets import Target
    from specdraft.train.config import RunConfig
    from specdraft.train.objective import TeacherHead


def training_objective(drafter: Eagle3Drafter, teacher: TeacherHead, run: RunConfig,
                       parallel: bool = False) -> TTTObjective:
    """The TTT unroll; `parallel` (P-EAGLE): every step after the first a mask slot."""
    return TTTObjective(drafter, teacher, run.ttt_steps, run.step_decay, run.loss, run.aux_noise, run.attention,
                        "data" if parallel else run.ttt_inputs, parallel=parallel)


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


class Eagle3(Family[DrafterConfig, Eagle3Drafter]):
    """EAGLE-3: a chain drafted one token a forward (or an EAGLE-2 tree); SGLang's layout read and written too."""

    model_type = "eagle3"
    config_type = DrafterConfig
    layouts = (SGLANG,)
    tree = True
    title = "EAGLE-3"
    shape_flags = SHAPE_FLAGS

    def new_config(self, target_config: PretrainedConfig, draft_vocab_size: int, aux_layer_ids: list[int],
                   verifier: str = "", run: RunConfig | None = None) -> DrafterConfig:
        if run is not None and run.draft_layers != 1:
            raise SpecdraftError(f"--draft-layers {run.draft_layers}: an {run.family} drafter has one decoder layer "
                                 "(vLLM serves it so); drop --draft-layers or train --family dflash")
        options = {} if run is None else {"norm_before_residual": run.norm_before_residual, "fc_norm": run.fc_norm,
                                          "norm_output": run.norm_output, "sliding_window": run.sliding_window}
        return DrafterConfig.from_target(target_config, draft_vocab_size=draft_vocab_size,
                                         aux_layer_ids=aux_layer_ids, verifier=verifier, run=run, **options)

    def build(self, cfg: DrafterConfig) -> Eagle3Drafter:
        return Eagle3Drafter(cfg)

    def init_from_target(self, drafter: Eagle3Drafter, target: Target, d2t: torch.Tensor, t2d: torch.Tensor,
                         run: RunConfig | None = None) -> None:
        """Embeddings and lm_head rows from the target; the decoder layer too with init_layer=target."""
        drafter.init_from_target(target.model, d2t, t2d)
        if run is not None and run.init_layer == "target":
            drafter.init_layer_from_target(last_layer_tensors(target))

    def objective(self, drafter: Eagle3Drafter, teacher: TeacherHead, run: RunConfig) -> TTTObjective:
        return training_objective(drafter, teacher, run)

    def proposer(self, drafter: Eagle3Drafter, k: int = 4, tree: TreeShape | None = None,
                 stop: float | None = None) -> EagleProposer:
        return EagleProposer(drafter, k, tree, stop)

    def checkpoint_config(self, cfg: DrafterConfig, dtype: str, speculative_tokens: int,
                          verifier_architectures: list[str]) -> dict:
        return checkpoint.build_config(cfg, dtype, speculative_tokens, verifier_architectures)

    def parse_config(self, config: dict, where: str) -> DrafterConfig:
        return checkpoint.parse_config(config, where)

    def validate(self, tensors: dict[str, torch.Tensor], cfg: DrafterConfig, where: str) -> None:
        validate_tensors(tensors, cfg, where)

    def fsdp_units(self, drafter: Eagle3Drafter) -> list[nn.Module]:
        """The wide matrices (V x H, nH x H, N x H); the decoder layer stays in the root unit (its KV cache
        must be the same object across TTT steps, and FSDP2 copies dataclass arguments)."""
        return [drafter.embed_tokens, drafter.fc, drafter.lm_head]


FAMILY = register(Eagle3())
