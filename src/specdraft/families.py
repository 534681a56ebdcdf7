"""Drafter families, registered under their speculators model type.

A family is one package under model/ that fills in a `Family`: its
config, its module, its training forward, its proposer for the generation loop and its checkpoint
schema. train/, infer/ and formats/ reach a drafter only through these functions (they never import
model/), so a new family is its own folder plus one line in BUILTIN (or a `register` call, as the
toy family in tests/test_families.py does). This module sits low in the import layers; the family
packages sit above train/ and infer/, whose primitives they use, and are imported by name here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specdraft.errors import SpecdraftError

if TYPE_CHECKING:    # torch loads with the first family, not with this module (the CLI names DEFAULT)
    import torch

# The family of `train` without --family, of bench's and generate's default method, of a config
# naming none: the only place outside its folder that a family is named, with BUILTIN.
DEFAULT = "eagle3"
BUILTIN = (
    "specdraft.model.eagle3",
    "specdraft.model.peagle",
    "specdraft.model.dflash",
    "specdraft.model.dspark",
)


@dataclass(frozen=True)
class Layout:
    """A checkpoint layout other than speculators that a family also reads (and maybe writes)."""

    name: str                                               # export --format NAME
    # (config.json, weights file) -> the layout name the folder holds (a family may read several), or None
    detect: Callable[[dict, Path], str | None]
    read: Callable[[dict, dict, str], tuple[dict, Any]]     # (config.json, tensors, where) -> (canonical, config)
    # (config, canonical tensors, dtype name, where) -> (config.json, tensors as the layout names them)
    write: Callable[[Any, dict, str, str], tuple[dict, dict]]
    unsupported: Callable[[Any], str | None] = lambda cfg: None   # what of this drafter the engine lacks
    looks_like: str = ""                                    # how its config.json is recognised, for errors
    needs: Callable[[Any], str | None] = lambda cfg: None         # the engine release this drafter needs, if newer
    # (target, folder of this layout, K) -> the command that serves it (the model card's, the report's)
    serve: Callable[[str, str, int], str] | None = None


@dataclass(frozen=True)
class Family:
    model_type: str                  # speculators_model_type in config.json, and the registry key
    config_type: type                # a dataclass with aux_layer_ids, draft_vocab_size, to_dict()
    # (target config, draft vocab size, aux layer ids, verifier id, run config or None) -> config
    new_config: Callable[..., Any]
    build: Callable[[Any], torch.nn.Module]                       # config -> an untrained drafter
    # (drafter, target (.model, .config), d2t, t2d, run config or None) -> None: what it takes from the target
    init_from_target: Callable[..., None]
    # (drafter, teacher head, run config) -> module whose forward(batch) returns (loss, metric sums)
    objective: Callable[..., torch.nn.Module]
    # (drafter, k, tree, stop) -> a Proposer for infer.speculative.generate
    proposer: Callable[..., Any]
    # (config, dtype name, speculative tokens, verifier architectures) -> config.json dict
    checkpoint_config: Callable[..., dict]
    parse_config: Callable[[dict, str], Any]                      # (config.json dict, where) -> config
    # (tensors, config, where) -> None: refuse missing or misshapen tensors, naming them
    validate: Callable[[dict, Any, str], None]
    # drafter -> the wide submodules FSDP2 shards as their own units
    fsdp_units: Callable[[torch.nn.Module], list[torch.nn.Module]] = lambda drafter: []
    layouts: tuple[Layout, ...] = ()                               # other engines' layouts (EAGLE-3: SGLang)
    # the tensors whose rows are draft ids: `train --from-pretrained --remap` moves them to the run's vocab
    # (lm_head's new rows start from the target's lm_head, any other's from zero)
    draft_vocab_rows: tuple[str, ...] = ("lm_head.weight",)
    # True: one drafter forward drafts a round's K tokens (P-EAGLE, DFlash), so a round's draft cost is
    # one forward whatever K; False: K forwards, one per token (EAGLE-3's chain). -k auto's cost model
    drafts_in_one_forward: bool = False
    # its proposer also drafts an EAGLE-2 style tree (--tree, bench's FAMILY-tree method): EAGLE-3
    tree: bool = False
    # config -> the longest draft it was trained to serve (DFlash: its block's slots), or None for no limit
    max_draft: Callable[[Any], int | None] = lambda cfg: None
    # the keys of vLLM's --speculative-config that select this family (besides model and K)
    vllm_speculative: tuple[tuple[str, Any], ...] = (("method", DEFAULT),)
    title: str = ""                  # how people name it: the model card's title ("EAGLE-3 drafter for ...")
    # the drafter config's fields a --from-pretrained run cannot change, each with the train flag that
    # sets it: the flag given with another value is refused, not recorded and ignored
    shape_flags: tuple[tuple[str, str], ...] = ()


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    FAMILIES[family.model_type] = family
    return family


def _load_builtin() -> None:
    for module in BUILTIN:
        importlib.import_module(module)


def family(model_type: str) -> Family:
    """The family registered under `model_type`, or one line listing the registered ones."""
    _load_builtin()
    if model_type not in FAMILIES:
        raise SpecdraftError(f"drafter family {model_type!r}: not registered; choose one of {', '.join(names())}")
    return FAMILIES[model_type]


def family_of(obj) -> Family:
    """The family of a drafter module or of its config (both carry `model_type`)."""
    cfg = getattr(obj, "config", obj)
    return family(getattr(cfg, "model_type", DEFAULT))


def names() -> list[str]:
    _load_builtin()
    return sorted(FAMILIES)


def layouts() -> list[tuple[Family, Layout]]:
    """Every registered family's other layouts."""
    _load_builtin()
    return [(f, layout) for f in FAMILIES.values() for layout in f.layouts]


def layout(fam: Family, name: str) -> Layout | None:
    return next((lay for lay in fam.layouts if lay.name == name), None)
