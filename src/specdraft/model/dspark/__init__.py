"""DSpark (DeepSeek): DFlash's parallel block plus a low-rank Markov head (the token before each slot
biases its logits, slot by slot) and a confidence head (each slot's estimated chance of acceptance,
which drives `--draft-stop`). Trained on blocks at sampled anchors of the same store; served by vLLM
from `speculators_model_type: "dspark"` (Qwen3DSparkForCausalLM).

module.py the config and nn.Module · objective.py the block forward plus the confidence loss ·
proposer.py the one-forward chain with the Markov bias and the confidence stop · checkpoint.py
config.json and tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdraft.families import Family, register
from specdraft.model import dflash
from specdraft.model.dspark import checkpoint
from specdraft.model.dspark.module import DSparkConfig, DSparkDrafter
from specdraft.model.dspark.objective import DSparkObjective
from specdraft.model.dspark.proposer import DSparkProposer

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig

    from specdraft.infer.tree import TreeShape
    from specdraft.targets import Target
    from specdraft.train.config import RunConfig
    from specdraft.train.objective import TeacherHead


class DSpark(Family[DSparkConfig, DSparkDrafter]):
    """DSpark: DFlash's block plus the Markov head (whose rows are draft ids too) and the confidence head;
    its config checks, target init, FSDP units, draft limit and shape flags are DFlash's."""

    model_type = "dspark"
    config_type = DSparkConfig
    draft_vocab_rows = ("lm_head.weight", "markov_head.markov_w2.weight")
    drafts_in_one_forward = True
    vllm_speculative = (("method", "dspark"),)
    title = "DSpark"
    shape_flags = dflash.SHAPE_FLAGS

    def new_config(self, target_config: PretrainedConfig, draft_vocab_size: int, aux_layer_ids: list[int],
                   verifier: str = "", run: RunConfig | None = None) -> DSparkConfig:
        base = dflash.FAMILY.new_config(target_config, draft_vocab_size, aux_layer_ids, verifier, run)
        return DSparkConfig.from_dict(base.to_dict())

    def build(self, cfg: DSparkConfig) -> DSparkDrafter:
        return DSparkDrafter(cfg)

    def init_from_target(self, drafter: DSparkDrafter, target: Target, d2t: torch.Tensor, t2d: torch.Tensor,
                         run: RunConfig | None = None) -> None:
        dflash.FAMILY.init_from_target(drafter, target, d2t, t2d, run)

    def objective(self, drafter: DSparkDrafter, teacher: TeacherHead, run: RunConfig) -> DSparkObjective:
        dflash.check_run(run)
        return DSparkObjective(drafter, teacher, run.ttt_steps, run.step_decay, run.loss, run.aux_noise)

    def proposer(self, drafter: DSparkDrafter, k: int = 4, tree: TreeShape | None = None,
                 stop: float | None = None) -> DSparkProposer:
        return DSparkProposer(drafter, k, tree, stop)

    def checkpoint_config(self, cfg: DSparkConfig, dtype: str, speculative_tokens: int,
                          verifier_architectures: list[str]) -> dict:
        return checkpoint.build_config(cfg, dtype, speculative_tokens, verifier_architectures)

    def parse_config(self, config: dict, where: str) -> DSparkConfig:
        return checkpoint.parse_config(config, where)

    def validate(self, tensors: dict[str, torch.Tensor], cfg: DSparkConfig, where: str) -> None:
        checkpoint.validate(tensors, cfg, where)

    def fsdp_units(self, drafter: DSparkDrafter) -> list[nn.Module]:
        return dflash.FAMILY.fsdp_units(drafter)

    def max_draft(self, cfg: DSparkConfig) -> int:
        return dflash.FAMILY.max_draft(cfg)


FAMILY = register(DSpark())
