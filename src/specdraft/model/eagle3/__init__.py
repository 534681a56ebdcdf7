"""EAGLE-3 (with the EAGLE-3.1 options): one decoder layer over fc(aux layers) + the token embedding,
trained with training-time test (TTT). Served by vLLM as `speculators_model_type: "eagle3"`.

config.py the drafter's config · module.py the nn.Module · objective.py the TTT training forward ·
proposer.py chain / tree drafting for the generation loop · checkpoint.py the speculators
config.json · tensors.py the tensor names and shapes · sglang.py the SGLang / EAGLE-repo layout.
"""

from __future__ import annotations

from specdraft.families import Family, Layout, register


def new_config(target_config, draft_vocab_size: int, aux_layer_ids: list[int], verifier: str = "", run=None):
    from specdraft.model.eagle3.config import DrafterConfig

    options = {} if run is None else {"norm_before_residual": run.norm_before_residual, "fc_norm": run.fc_norm,
                                      "norm_output": run.norm_output}
    return DrafterConfig.from_target(target_config, draft_vocab_size=draft_vocab_size, aux_layer_ids=aux_layer_ids,
                                     verifier=verifier, **options)


def build(cfg):
    from specdraft.model.eagle3.module import Eagle3Drafter

    return Eagle3Drafter(cfg)


def init_from_target(drafter, target, d2t, t2d, run=None) -> None:
    """Embeddings and lm_head rows from the target; the decoder layer too with init_layer=target."""
    from specdraft.targets import last_layer_tensors

    drafter.init_from_target(target.model, d2t, t2d)
    if run is not None and run.init_layer == "target":
        drafter.init_layer_from_target(last_layer_tensors(target))


def objective(drafter, teacher, run):
    from specdraft.model.eagle3.objective import TTTObjective

    return TTTObjective(drafter, teacher, run.ttt_steps, run.step_decay, run.loss, run.aux_noise, run.attention,
                        run.ttt_inputs)


def proposer(drafter, k: int = 4, tree=None, stop: float | None = None):
    from specdraft.model.eagle3.proposer import EagleProposer

    return EagleProposer(drafter, k=k, tree=tree, stop=stop)


def checkpoint_config(cfg, dtype: str, speculative_tokens: int, verifier_architectures: list[str]) -> dict:
    from specdraft.model.eagle3.checkpoint import build_config

    return build_config(cfg, dtype, speculative_tokens, verifier_architectures)


def parse_config(config: dict, where: str):
    from specdraft.model.eagle3.checkpoint import parse_config as parse

    return parse(config, where)


def validate(tensors: dict, cfg, where: str) -> None:
    from specdraft.model.eagle3.tensors import validate as check

    check(tensors, cfg, where)


def fsdp_units(drafter) -> list:
    """The wide matrices (V x H, nH x H, N x H); the decoder layer stays in the root unit (its KV cache
    must be the same object across TTT steps, and FSDP2 copies dataclass arguments)."""
    return [drafter.embed_tokens, drafter.fc, drafter.lm_head]


def sglang_detect(config: dict, weights) -> str | None:
    from specdraft.model.eagle3.sglang import ARCHITECTURE

    if ARCHITECTURE not in (config.get("architectures") or []):
        return None
    return "eagle" if weights.name == "pytorch_model.bin" else "sglang"     # the official EAGLE repo: .bin


def sglang_read(config: dict, tensors: dict, where: str):
    from specdraft.model.eagle3 import sglang

    tensors = sglang.to_canonical_names(tensors)
    lm_head = tensors.get("lm_head.weight")
    return tensors, sglang.parse_config(config, where, None if lm_head is None else lm_head.shape[0])


def sglang_write(cfg, tensors: dict, dtype: str, where: str):
    from specdraft.model.eagle3 import sglang

    return sglang.build_config(cfg, dtype, where), sglang.to_sglang_names(tensors)


def sglang_unsupported(cfg):
    from specdraft.model.eagle3.sglang import unsupported

    return unsupported(cfg)


def _config_type():
    from specdraft.model.eagle3.config import DrafterConfig

    return DrafterConfig


FAMILY = register(Family(model_type="eagle3", config_type=_config_type(), new_config=new_config, build=build,
                         init_from_target=init_from_target, objective=objective, proposer=proposer,
                         checkpoint_config=checkpoint_config, parse_config=parse_config, validate=validate,
                         fsdp_units=fsdp_units,
                         layouts=(Layout("sglang", sglang_detect, sglang_read, sglang_write, sglang_unsupported,
                                        "config.json with architectures ['LlamaForCausalLMEagle3'] (SGLang / EAGLE repo)"),)))
