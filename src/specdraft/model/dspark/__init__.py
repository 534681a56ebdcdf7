"""DSpark (DeepSeek): DFlash's parallel block plus a low-rank Markov head (the token before each slot
biases its logits, slot by slot) and a confidence head (each slot's estimated chance of acceptance,
which drives `--draft-stop`). Trained on blocks at sampled anchors of the same store; served by vLLM
from `speculators_model_type: "dspark"` (Qwen3DSparkForCausalLM).

module.py the config and nn.Module · objective.py the block forward plus the confidence loss ·
proposer.py the one-forward chain with the Markov bias and the confidence stop · checkpoint.py
config.json and tensors.
"""

from __future__ import annotations

from specdraft.families import Family, register
from specdraft.model import dflash
from specdraft.model.dspark import checkpoint
from specdraft.model.dspark.module import DSparkConfig, DSparkDrafter
from specdraft.model.dspark.objective import DSparkObjective
from specdraft.model.dspark.proposer import DSparkProposer


def new_config(target_config, draft_vocab_size: int, aux_layer_ids: list[int], verifier: str = "", run=None):
    base = dflash.new_config(target_config, draft_vocab_size, aux_layer_ids, verifier, run)
    return DSparkConfig.from_dict(base.to_dict())


def training_objective(drafter, teacher, run) -> DSparkObjective:
    dflash.check_run(run)
    return DSparkObjective(drafter, teacher, run.ttt_steps, run.step_decay, run.loss, run.aux_noise)


FAMILY = register(Family(model_type="dspark", config_type=DSparkConfig, new_config=new_config, build=DSparkDrafter,
                         init_from_target=dflash.init_from_target, objective=training_objective,
                         proposer=DSparkProposer, checkpoint_config=checkpoint.build_config,
                         parse_config=checkpoint.parse_config, validate=checkpoint.validate,
                         fsdp_units=lambda drafter: [drafter.embed_tokens, drafter.fc, drafter.lm_head],
                         drafts_in_one_forward=True, vllm_speculative=(("method", "dspark"),),
                         draft_vocab_rows=("lm_head.weight", "markov_head.markov_w2.weight"),
                         max_draft=lambda cfg: cfg.block_size - 1, title="DSpark", shape_flags=dflash.SHAPE_FLAGS))
