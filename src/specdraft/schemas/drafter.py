"""A drafter folder's config.json: the fields every layout and reader shares (speculators', and SGLang's and the
EAGLE repo's Llama config at the top level), which a family's checkpoint module extends with its own fields (a
subclass of DrafterConfigFile). Every reader (a family's parse_config, layout detection, vocab, plan, doctor, the
served bench, the model card) goes through `read_drafter_config` or `check_drafter_config`."""

from __future__ import annotations

import functools
import typing
from pathlib import Path

from pydantic import BaseModel, ConfigDict, create_model

STRICT = ConfigDict(strict=True, extra="allow")    # what a reader uses is typed; the rest is the engine's
FIX = "re-export the drafter or fix config.json"


class RopeParameters(BaseModel):
    model_config = STRICT
    rope_theta: float | None = None


class LlamaLayer(BaseModel):
    """The draft's decoder layer as a Llama (or Qwen3) config: speculators' transformer_layer_config,
    or the top level of an SGLang config."""
    model_config = STRICT
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    rms_norm_eps: float | None = None
    rope_theta: float | None = None
    rope_parameters: RopeParameters | None = None       # transformers 5
    rope_scaling: dict | None = None                    # transformers 4
    max_position_embeddings: int | None = None
    hidden_act: str | None = None
    num_hidden_layers: int | None = None                # a family drafting with several layers
    layer_types: list[str] | None = None                # "sliding_attention": the layer slides (sliding_window)


class Verifier(BaseModel):
    model_config = STRICT
    name_or_path: str | None = None
    architectures: list[str] | None = None


class ProposalMethod(BaseModel):
    model_config = STRICT
    speculative_tokens: int | None = None               # the K the export serves


class SpeculatorsBlock(BaseModel):
    model_config = STRICT
    verifier: Verifier | None = None
    proposal_methods: list[ProposalMethod] | None = None


class SpecdraftBlock(BaseModel):
    """What specdraft writes besides the engine's fields: the drafter config it trained with, read back whole."""
    model_config = STRICT
    format_version: int | None = None
    drafter_config: dict | None = None


class DrafterConfigFile(LlamaLayer):
    """config.json of a drafter folder, the fields every layout shares; all optional (a layout names the ones it
    needs). A family's checkpoint module subclasses it with its own fields."""
    speculators_model_type: str | None = None           # the speculators layout and its family
    architectures: list[str] | None = None              # how another layout is recognised
    speculators_config: SpeculatorsBlock | None = None
    transformer_layer_config: LlamaLayer | None = None
    draft_vocab_size: int | None = None
    specdraft: SpecdraftBlock | None = None


@functools.cache
def file_model(base: type[DrafterConfigFile] = DrafterConfigFile, config_type: type | None = None):
    """The schema `base` (a family's) with its specdraft.drafter_config block typed as the fields of `config_type`
    (the family's config dataclass; fields of an older version are ignored, as its from_dict ignores them)."""
    if config_type is None:
        return base
    hints = typing.get_type_hints(config_type)
    name = config_type.__name__
    fields = create_model(f"{name}Fields", __config__=ConfigDict(strict=True, extra="ignore"),
                          **{f: (hints[f] | None, None) for f in config_type.__dataclass_fields__})
    block = create_model(f"{name}Block", __base__=SpecdraftBlock, drafter_config=(fields | None, None))
    return create_model(f"{name}File", __base__=base, specdraft=(block | None, None))


def config_file(where) -> str:
    """The config.json a checkpoint folder's `where` names, for the one line of a wrong field."""
    where = str(where)
    return where if where.endswith("config.json") else str(Path(where) / "config.json")


def check_drafter_config(config, where, base: type[DrafterConfigFile] = DrafterConfigFile,
                         config_type: type | None = None) -> dict:
    """`config` (read from the drafter folder `where`) checked against file_model(base, config_type): the first
    field of a wrong type is one line naming the file and the field. Returns `config`, the dict its reader indexes."""
    from specdraft.io import check_model

    check_model(config, file_model(base, config_type), config_file(where), FIX)
    return config


def read_drafter_config(folder) -> dict:
    """A drafter folder's config.json, read and checked against the fields every layout shares."""
    from specdraft.io import read_json

    return check_drafter_config(read_json(Path(folder) / "config.json", "drafter config"), folder)
