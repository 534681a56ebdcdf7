"""The SGLang / official EAGLE-3 layout: a plain Llama config.json with
`architectures: ["LlamaForCausalLMEagle3"]` and `draft_vocab_size`, tensors named `midlayer.*`
instead of `layers.0.*` (fc, norm, lm_head, embed_tokens, d2t, t2d unchanged).

EAGLE-3.1's options (`fc_norm`: tensors `fc_norm.{i}.weight`, SGLang's names too; `norm_output`)
are written as the top-level config keys SGLang's LlamaForCausalLMEagle3 reads since
sgl-project/sglang#24663 (May 2026); an older SGLang loads such a folder without its fc_norm weights
(unknown names are skipped), so the card says which release it needs. `norm_before_residual` has no
SGLang counterpart: that export is refused, naming the retrain flag.

Aux layer ids: SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` and captures layer
id+1's input ("the output of layer i"), so it stores OUR id - 1 there. vLLM reads the
top-level `eagle_aux_hidden_state_layer_ids` with our meaning, so both are written."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from specdraft.errors import SpecdraftError
from specdraft.model.common.checkpoint import FORMAT_VERSION, config_from_llama, llama_layer_dict
from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.checkpoint import Eagle3File
from specdraft.schemas.drafter import check_drafter_config

ARCHITECTURE = "LlamaForCausalLMEagle3"
OURS, THEIRS = "layers.0.", "midlayer."


class EagleConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    eagle_aux_hidden_state_layer_ids: list[int] | None = None   # SGLang's meaning: our id - 1


class SGLangFile(Eagle3File):
    """An SGLang / EAGLE repo config.json: the Llama layer at the top level (the shared schema's), EAGLE-3's fields
    and SGLang's eagle_config."""
    eagle_config: EagleConfig | None = None


def to_sglang_names(tensors: dict) -> dict:
    return {(THEIRS + k[len(OURS):] if k.startswith(OURS) else k): v for k, v in tensors.items()}


def to_canonical_names(tensors: dict) -> dict:
    return {(OURS + k[len(THEIRS):] if k.startswith(THEIRS) else k): v for k, v in tensors.items()}


# SGLang's EAGLE-3.1 support: the pull request that made LlamaForCausalLMEagle3 read fc_norm / norm_output
SGLANG_EAGLE31 = "sgl-project/sglang#24663, May 2026"


def unsupported(cfg: DrafterConfig) -> str | None:
    """What of this drafter SGLang's LlamaForCausalLMEagle3 does not implement, or None."""
    if getattr(cfg, "sliding_window", 0):
        return "sliding_window"
    return "norm_before_residual" if cfg.norm_before_residual else None


def needs(cfg: DrafterConfig) -> str | None:
    """The SGLang release an EAGLE-3.1 drafter needs (older ones skip its fc_norm weights), or None."""
    used = [name for name in ("fc_norm", "norm_output") if getattr(cfg, name)]
    if not used:
        return None
    return (f"needs an SGLang with EAGLE-3.1 drafters ({' and '.join(used)}: {SGLANG_EAGLE31}); an older "
            "SGLang ignores them without a word (and skips the fc_norm weights) and accepts few drafts")


def serve_command(target: str, folder: str, k: int) -> str:
    """SGLang's launch line for this layout's folder, drafting K tokens per round (a chain: top-k 1)."""
    return (f"python -m sglang.launch_server --model-path {target} \\\n"
            f"  --speculative-algorithm EAGLE3 \\\n  --speculative-draft-model-path {folder} \\\n"
            f"  --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")


def build_config(cfg: DrafterConfig, dtype: str, where: str) -> dict:
    if unsupported(cfg) == "sliding_window":
        raise SpecdraftError(f"{where}: the drafter attends a sliding window of {cfg.sliding_window} positions, which "
                             "SGLang's LlamaForCausalLMEagle3 does not implement (it attends the whole context); "
                             "serve it with vLLM (export --format speculators), or retrain with --sliding-window 0")
    if unsupported(cfg):
        raise SpecdraftError(f"{where}: the drafter uses norm_before_residual, which SGLang's LlamaForCausalLMEagle3 "
                             "does not implement; serve it with vLLM (export --format speculators), or retrain it "
                             "for SGLang with train's --no-norm-before-residual")
    config = llama_layer_dict(cfg, dtype)
    config.update({"architectures": [ARCHITECTURE], "draft_vocab_size": cfg.draft_vocab_size,
                   "tie_word_embeddings": False, "norm_before_residual": False,
                   "fc_norm": bool(cfg.fc_norm), "norm_output": bool(cfg.norm_output),
                   "specdraft": {"format_version": FORMAT_VERSION, "drafter_config": cfg.to_dict()}})
    if cfg.aux_layer_ids:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layer_ids],
                                  "use_aux_hidden_state": True}
        config["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layer_ids)
    return config


def parse_config(config: dict, where: str, lm_head_rows: int | None) -> DrafterConfig:
    check_drafter_config(config, where, SGLangFile, DrafterConfig)
    block = config.get("specdraft") or {}
    if block.get("drafter_config"):
        return DrafterConfig.from_dict(block["drafter_config"])
    eagle = config.get("eagle_config") or {}
    if eagle.get("eagle_aux_hidden_state_layer_ids"):
        aux = [i + 1 for i in eagle["eagle_aux_hidden_state_layer_ids"]]   # SGLang meaning -> ours
    else:
        aux = list(config.get("eagle_aux_hidden_state_layer_ids") or [])
    draft_vocab = config.get("draft_vocab_size") or lm_head_rows or config.get("vocab_size")
    return config_from_llama(
        DrafterConfig, config, where, draft_vocab_size=int(draft_vocab), aux_layer_ids=aux,
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        fc_norm=bool(config.get("fc_norm", False)), norm_output=bool(config.get("norm_output", False)),
        verifier="")  # EAGLE configs do not name the verifier
