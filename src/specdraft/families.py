"""Drafter families, registered under their speculators model type.

A family is one package under model/ whose __init__.py subclasses `Family` (its config type, the
drafter module, the training forward, the proposer for the generation loop, the checkpoint schema,
and the facts shared code asks instead of a name) and registers one instance of it:
`FAMILY = register(Eagle3())`. train/, infer/ and formats/ reach a drafter only through these
functions (they never import model/), so a new family is its own folder plus one line in BUILTIN
(or a `register` call, as the toy family in tests/test_families.py does). This module sits low in
the import layers; the family packages sit above train/ and infer/, whose primitives they use, and
are imported by name here. So Family's signatures name the types of those higher layers (the run
config, the teacher head, the target, the proposer, the tree shape) in strings by their full path,
without importing them: import-linter and tests/test_layout.py count an import under TYPE_CHECKING
too (train/config.py imports this module, so it would be a cycle).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from specdraft.errors import SpecdraftError

if TYPE_CHECKING:    # torch loads with the first family, not with this module (the CLI names DEFAULT)
    import torch
    from torch import nn
    from transformers import PretrainedConfig

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


Config = TypeVar("Config")                      # the family's drafter config (Family.config_type)
Drafter = TypeVar("Drafter", bound="nn.Module")  # the family's drafter module (what Family.build returns)


class Family(ABC, Generic[Config, Drafter]):
    """A drafter family: what shared code asks of a drafter instead of naming it. Subclassed once per
    family package (`class Eagle3(Family[DrafterConfig, Eagle3Drafter])`) and registered as one
    instance; the methods without a default are abstract, and the class attributes below hold the
    plain facts with their defaults (a subclass sets model_type, config_type and what differs)."""

    model_type: str                  # speculators_model_type in config.json, and the registry key
    config_type: type[Config]        # a dataclass with aux_layer_ids, draft_vocab_size, to_dict(), from_dict()
    layouts: tuple[Layout, ...] = ()                               # other engines' layouts (EAGLE-3: SGLang)
    # the tensors whose rows are draft ids: `train --from-pretrained --remap` moves them to the run's vocab
    # (lm_head's new rows start from the target's lm_head, any other's from zero)
    draft_vocab_rows: tuple[str, ...] = ("lm_head.weight",)
    # True: one drafter forward drafts a round's K tokens (P-EAGLE, DFlash), so a round's draft cost is
    # one forward whatever K; False: K forwards, one per token (EAGLE-3's chain). -k auto's cost model
    drafts_in_one_forward: bool = False
    # its proposer also drafts an EAGLE-2 style tree (--tree, bench's FAMILY-tree method): EAGLE-3
    tree: bool = False
    # the keys of vLLM's --speculative-config that select this family (besides model and K)
    vllm_speculative: tuple[tuple[str, Any], ...] = (("method", DEFAULT),)
    title: str = ""                  # how people name it: the model card's title ("EAGLE-3 drafter for ...")
    # the drafter config's fields a --from-pretrained run cannot change, each with the train flag that
    # sets it: the flag given with another value is refused, not recorded and ignored
    shape_flags: tuple[tuple[str, str], ...] = ()

    @abstractmethod
    def new_config(self, target_config: PretrainedConfig, draft_vocab_size: int, aux_layer_ids: list[int],
                   verifier: str = "", run: "specdraft.train.config.RunConfig | None" = None) -> Config:
        """A new drafter's config for a target of `target_config`: `draft_vocab_size` draft ids, fed
        the target's `aux_layer_ids`, `verifier` the target's id (hub id or path). With `run` (train's
        config) it takes the run's family options and refuses, naming the flag, those the family
        lacks; without it (bench, tests), the family's defaults."""

    @abstractmethod
    def build(self, cfg: Config) -> Drafter:
        """An untrained drafter of this config (training starts from it; a checkpoint loads into it)."""

    @abstractmethod
    def init_from_target(self, drafter: Drafter, target: "specdraft.targets.Target", d2t: torch.Tensor,
                         t2d: torch.Tensor, run: "specdraft.train.config.RunConfig | None" = None) -> None:
        """What a new drafter takes from the target (`target.model`) before training: its embeddings and
        the lm_head rows of the draft ids (`d2t`, `t2d`: the draft vocab's mappings), and whatever
        else the run's options ask for (EAGLE-3's --init-layer target)."""

    @abstractmethod
    def objective(self, drafter: Drafter, teacher: "specdraft.train.objective.TeacherHead",
                  run: "specdraft.train.config.RunConfig") -> nn.Module:
        """The training forward: a module whose forward(batch) returns (loss, metric sums), the teacher
        head giving the target's distribution; train's loop and `probe` run it."""

    @abstractmethod
    def proposer(self, drafter: Drafter, k: int = 4, tree: "specdraft.infer.tree.TreeShape | None" = None,
                 stop: float | None = None) -> "specdraft.infer.speculative.Proposer":
        """The drafter's Proposer for infer.speculative.generate: a chain of up to `k` tokens a round
        (or a tree of this shape where the family drafts one: `tree` True; the others refuse it), cut
        where its confidence falls below `stop` (--draft-stop)."""

    @abstractmethod
    def checkpoint_config(self, cfg: Config, dtype: str, speculative_tokens: int,
                          verifier_architectures: list[str]) -> dict:
        """The speculators config.json (a dict) of a drafter saved in `dtype` (its name), served with
        `speculative_tokens` tokens a round over a target of `verifier_architectures`."""

    @abstractmethod
    def parse_config(self, config: dict, where: str) -> Config:
        """The drafter config of a speculators config.json (a dict), refusing a bad one in one line
        naming `where`."""

    @abstractmethod
    def validate(self, tensors: dict[str, torch.Tensor], cfg: Config, where: str) -> None:
        """Refuse a checkpoint's missing or misshapen tensors, naming them and `where`."""

    def fsdp_units(self, drafter: Drafter) -> list[nn.Module]:
        """The wide submodules FSDP2 shards as their own units; by default none (the drafter is one unit)."""
        return []

    def max_draft(self, cfg: Config) -> int | None:
        """The longest draft a drafter of this config was trained to serve (DFlash: its block's slots);
        by default None, no limit."""
        return None


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
