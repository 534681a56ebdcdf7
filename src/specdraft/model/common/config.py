"""The part of a drafter's configuration every family shares: the target's shapes (hidden size, heads,
vocab, rope), the draft vocab size, the aux layer ids and the verifier, built from the target's
config so the shapes always agree with the verifier. A family's config is a dataclass subclass that
adds its own fields (its layout options, its block)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


SHAPE_SETTINGS = (("num_attention_heads", "draft_heads"), ("num_key_value_heads", "draft_kv_heads"),
                  ("head_dim", "draft_head_dim"), ("intermediate_size", "draft_intermediate"))
SHAPE_FLAGS = tuple((field, "--" + setting.replace("_", "-")) for field, setting in SHAPE_SETTINGS)


def run_shape(run) -> dict:
    """The drafter-shape settings a run gives (0 = the target's default), as config fields."""
    return {field: getattr(run, setting) for field, setting in SHAPE_SETTINGS if run is not None and getattr(run, setting, 0)}


@dataclass
class BaseConfig:
    hidden_size: int                      # H, the target's hidden size
    intermediate_size: int                # MLP width of a decoder layer
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int                       # target vocab (embed_tokens rows)
    draft_vocab_size: int                 # lm_head rows
    aux_layer_ids: list[int] = field(default_factory=list)  # target layer ids feeding fc
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"
    tie_embeddings_to_target: bool = True  # embed_tokens copied from the target and frozen
    target_num_layers: int = 0
    verifier: str = ""                    # the target's id (hub id or path)

    @classmethod
    def from_target(cls, target_config, draft_vocab_size: int, aux_layer_ids: list[int],
                    verifier: str = "", run=None, **overrides) -> "BaseConfig":
        """The drafter's config for this target; `run`'s drafter-shape settings (--draft-heads,
        --draft-kv-heads, --draft-head-dim, --draft-intermediate) replace the adapter's defaults."""
        from specdraft.adapter import drafter_shape, text_config

        tc = text_config(target_config)          # a vision-language wrapper's language model
        shape = drafter_shape(target_config)     # MLA/MoE targets: a dense layer of sensible width
        rope = getattr(tc, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0))
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"} or None
        if scaling and scaling.get("rope_type") == "default":
            scaling = None
        cfg = cls(hidden_size=tc.hidden_size, intermediate_size=shape["intermediate_size"],
                  num_attention_heads=shape["num_attention_heads"],
                  num_key_value_heads=shape["num_key_value_heads"], head_dim=shape["head_dim"],
                  vocab_size=tc.vocab_size, draft_vocab_size=draft_vocab_size,
                  aux_layer_ids=list(aux_layer_ids), rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6),
                  rope_theta=float(theta), rope_scaling=scaling,
                  max_position_embeddings=getattr(tc, "max_position_embeddings", 4096),
                  hidden_act=getattr(tc, "hidden_act", "silu"),
                  target_num_layers=tc.num_hidden_layers, verifier=verifier)
        for k, v in {**run_shape(run), **overrides}.items():
            setattr(cfg, k, v)
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            from specdraft.errors import SpecdraftError

            raise SpecdraftError(f"--draft-kv-heads {cfg.num_key_value_heads}: must divide the drafter's "
                                 f"{cfg.num_attention_heads} attention heads")
        return cfg

    @property
    def num_aux(self) -> int:
        """Aux states fc reads: one per aux layer id; 3 (the default capture's) for an
        imported config naming none."""
        return len(self.aux_layer_ids) or 3

    def llama_config(self):
        """The 1-layer Llama config of the decoder layer (transformer_layer_config in speculators)."""
        from transformers import LlamaConfig

        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling:
            rope.update(self.rope_scaling)
            rope["rope_theta"] = self.rope_theta
        return LlamaConfig(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                           num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                           num_hidden_layers=1, vocab_size=self.vocab_size,
                           rms_norm_eps=self.rms_norm_eps, rope_parameters=rope,
                           max_position_embeddings=self.max_position_embeddings,
                           hidden_act=self.hidden_act, attention_bias=False, mlp_bias=False,
                           tie_word_embeddings=False)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "BaseConfig":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})
