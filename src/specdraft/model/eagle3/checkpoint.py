"""The speculators (vLLM) layout: config.json with `speculators_model_type: "eagle3"` and the
tensors under their canonical names (`layers.0.*`). vLLM recognises the layout by that key,
reads `transformer_layer_config` as the draft's Llama config, and takes `draft_vocab_size`,
`norm_before_residual` (vLLM assumes True when it is absent, so it is always written),
`norm_output`, `fc_norm` (EAGLE-3.1: tensors `fc_norm.{i}.weight`) and
`eagle_aux_hidden_state_layer_ids` from the top level."""

from __future__ import annotations

from specdraft.errors import SpecdraftError
from specdraft.model.common.checkpoint import (FORMAT_VERSION, SPECULATORS_VERSION, config_from_llama,
                                               llama_layer_dict, require_keys)
from specdraft.model.eagle3.config import DrafterConfig
from specdraft.schemas.drafter import DrafterConfigFile, check_drafter_config, config_file

MODEL_TYPE = "eagle3"
ARCHITECTURE = "Eagle3Speculator"


class Eagle3File(DrafterConfigFile):
    """An EAGLE-3 config.json: the shared fields (schemas/drafter.py) and the top-level ones vLLM reads."""
    eagle_aux_hidden_state_layer_ids: list[int] | None = None
    norm_before_fc: bool | None = None
    norm_before_residual: bool | None = None
    norm_output: bool | None = None
    fc_norm: bool | None = None
    embed_requires_grad: bool | None = None


def build_config(cfg: DrafterConfig, dtype: str, speculative_tokens: int,
                 verifier_architectures: list[str]) -> dict:
    config = {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                  "verifier_accept_k": 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": cfg.verifier or None, "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": llama_layer_dict(cfg, dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": bool(cfg.norm_before_residual),
        "norm_output": bool(cfg.norm_output),
        "norm_before_fc": False,
        "fc_norm": bool(cfg.fc_norm),
        "embed_requires_grad": not cfg.tie_embeddings_to_target,
        "dtype": dtype,
        "torch_dtype": dtype,
        "specdraft": {"format_version": FORMAT_VERSION, "drafter_config": cfg.to_dict()},
    }
    if cfg.aux_layer_ids:
        config["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layer_ids)
    if cfg.sliding_window:     # vLLM's Llama attention slides where layer_types says sliding_attention
        config["transformer_layer_config"].update({"layer_types": ["sliding_attention"],
                                                   "sliding_window": int(cfg.sliding_window)})
    return config


def sliding_window_of(layer: dict, where: str) -> int:
    """The window a speculators layer config slides over (0: full attention): `sliding_window` where
    `layer_types` names sliding_attention."""
    if "sliding_attention" not in (layer.get("layer_types") or []):
        return 0
    window = layer.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise SpecdraftError(f"{config_file(where)}: transformer_layer_config.layer_types slides but sliding_window "
                             f"is {window!r}; give it the window in tokens (e.g. 2048)")
    return window


def parse_config(config: dict, where: str) -> DrafterConfig:
    """DrafterConfig from a speculators config.json (ours round-trips through its "specdraft" block)."""
    check_drafter_config(config, where, Eagle3File, DrafterConfig)
    require_keys(config, ["transformer_layer_config", "draft_vocab_size", "speculators_config"], where,
                 "re-export the drafter or fix config.json")
    if config.get("norm_before_fc"):
        raise SpecdraftError(f"{where}: norm_before_fc is true (one RMSNorm over all aux states before fc); "
                             "specdraft implements fc_norm (a norm per aux chunk) but not this variant")
    block = config.get("specdraft") or {}
    if block.get("drafter_config"):
        return DrafterConfig.from_dict(block["drafter_config"])
    verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path") or ""
    return config_from_llama(
        DrafterConfig, config["transformer_layer_config"], f"{where} transformer_layer_config",
        draft_vocab_size=config["draft_vocab_size"],
        aux_layer_ids=list(config.get("eagle_aux_hidden_state_layer_ids") or []),
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        norm_output=bool(config.get("norm_output", False)),
        fc_norm=bool(config.get("fc_norm", False)),
        sliding_window=sliding_window_of(config["transformer_layer_config"], where),
        tie_embeddings_to_target=not config.get("embed_requires_grad", False),
        verifier=verifier)
