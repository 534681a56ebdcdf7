"""DFlash: a block drafter over N target layers. One forward drafts K tokens: the last accepted
token and K mask slots attend to the context built from the target's aux states (fc, hidden_norm,
then each layer's own k/v projections). Trained on blocks at sampled anchors of the same store
EAGLE-3 trains on; served by vLLM from `speculators_model_type: "dflash"` (DFlashDraftModel).

module.py the config and nn.Module · objective.py the block training forward · proposer.py the
one-forward chain · checkpoint.py config.json and tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdraft.errors import SpecdraftError
from specdraft.families import Family, register
from specdraft.model.common.config import SHAPE_FLAGS as COMMON_SHAPE_FLAGS
from specdraft.model.dflash import checkpoint
from specdraft.model.dflash.module import DFlashConfig, DFlashDrafter
from specdraft.model.dflash.objective import DFlashObjective
from specdraft.model.dflash.proposer import DFlashProposer
from specdraft.model.common.mask import mask_token_of

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig

    from specdraft.infer.tree import TreeShape
    from specdraft.targets import Target
    from specdraft.train.config import RunConfig
    from specdraft.train.objective import TeacherHead

# EAGLE-3's options with no DFlash counterpart: (setting, the value DFlash trains with, why)
EAGLE_ONLY = (("fc_norm", False, "vLLM's DFlash has no fc_norm"),
              ("norm_before_residual", False, "DFlash's layers are plain pre-norm Qwen3 layers"),
              ("norm_output", False, "DFlash feeds no hidden state back"),
              ("init_layer", "fresh", "DFlash's layers take H-wide inputs, not EAGLE-3's 2H"),
              ("ttt_inputs", "data", "DFlash's mask slots read no drafted tokens"),
              ("attention", "sdpa", "DFlash's block mask runs on sdpa"))


# what --from-pretrained keeps: the drafter config fields the train flags set (the block: anchor + --ttt-steps slots)
SHAPE_FLAGS = (("num_layers", "--draft-layers"), ("block_size", "--ttt-steps")) + COMMON_SHAPE_FLAGS


def check_run(run: RunConfig) -> None:
    """Refuse the run options a block family lacks (DFlash and DSpark), naming the flag."""
    if run.sliding_window:
        raise SpecdraftError(f"--sliding-window {run.sliding_window}: {run.family} blocks attend the whole context "
                             "here (specdraft does not train a sliding block mask yet); drop --sliding-window")
    for name, value, why in EAGLE_ONLY:
        if getattr(run, name) != value:
            flag = "--" + name.replace("_", "-")
            raise SpecdraftError(f"{flag} {getattr(run, name)}: an EAGLE-3 option ({why}); train --family "
                                 f"{run.family} without it")


class DFlash(Family[DFlashConfig, DFlashDrafter]):
    """DFlash: a block of K mask slots drafted in one forward, over N layers of its own."""

    model_type = "dflash"
    config_type = DFlashConfig
    drafts_in_one_forward = True
    vllm_speculative = (("method", "dflash"),)
    title = "DFlash"
    shape_flags = SHAPE_FLAGS

    def new_config(self, target_config: PretrainedConfig, draft_vocab_size: int, aux_layer_ids: list[int],
                   verifier: str = "", run: RunConfig | None = None) -> DFlashConfig:
        if run is not None:
            check_run(run)
        base = DFlashConfig.from_target(target_config, draft_vocab_size=draft_vocab_size,
                                        aux_layer_ids=aux_layer_ids, verifier=verifier, run=run)
        base.mask_token_id = mask_token_of(target_config)
        base.block_size = (run.ttt_steps if run is not None else 3) + 1
        base.num_layers = run.draft_layers if run is not None else 1
        return base

    def build(self, cfg: DFlashConfig) -> DFlashDrafter:
        return DFlashDrafter(cfg)

    def init_from_target(self, drafter: DFlashDrafter, target: Target, d2t: torch.Tensor, t2d: torch.Tensor,
                         run: RunConfig | None = None) -> None:
        """Embeddings and lm_head rows from the target."""
        drafter.init_from_target(target.model, d2t, t2d)

    def objective(self, drafter: DFlashDrafter, teacher: TeacherHead, run: RunConfig) -> DFlashObjective:
        check_run(run)
        return DFlashObjective(drafter, teacher, run.ttt_steps, run.step_decay, run.loss, run.aux_noise)

    def proposer(self, drafter: DFlashDrafter, k: int = 4, tree: TreeShape | None = None,
                 stop: float | None = None) -> DFlashProposer:
        return DFlashProposer(drafter, k, tree, stop)

    def checkpoint_config(self, cfg: DFlashConfig, dtype: str, speculative_tokens: int,
                          verifier_architectures: list[str]) -> dict:
        return checkpoint.build_config(cfg, dtype, speculative_tokens, verifier_architectures)

    def parse_config(self, config: dict, where: str) -> DFlashConfig:
        return checkpoint.parse_config(config, where)

    def validate(self, tensors: dict[str, torch.Tensor], cfg: DFlashConfig, where: str) -> None:
        checkpoint.validate(tensors, cfg, where)

    def fsdp_units(self, drafter: DFlashDrafter) -> list[nn.Module]:
        return [drafter.embed_tokens, drafter.fc, drafter.lm_head]

    def max_draft(self, cfg: DFlashConfig) -> int:
        """The block's draft slots (the anchor takes its first position)."""
        return cfg.block_size - 1


FAMILY = register(DFlash())
