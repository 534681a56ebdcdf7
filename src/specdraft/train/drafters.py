"""The drafter a run starts from: a fresh one initialised from the target, a pretrained one (with
its lm_head rows moved to the run's vocab when the mappings differ), or the run's own latest
checkpoint on --resume."""

from __future__ import annotations

from pathlib import Path

import torch

from specdraft import vocab as vocab_mod
from specdraft.errors import SpecdraftError
from specdraft.formats.checkpoints import load_drafter
from specdraft.families import family, family_of
from specdraft.train import checkpoint as ckpt
from specdraft.train.config import RunConfig
from specdraft.train.inputs import check_resume_inputs
from specdraft.train.runtime import TrainData


def fresh_drafter(cfg: RunConfig, target, vocab, layer_ids: list[int]) -> torch.nn.Module:
    """A new drafter of the run's family, seeded, with what the family takes from the target."""
    torch.manual_seed(cfg.seed)
    fam = family(cfg.family)
    drafter = fam.build(fam.new_config(target.config, vocab.draft_vocab_size, layer_ids, target.name, cfg))
    fam.init_from_target(drafter, target, vocab.d2t, vocab.t2d, cfg)
    return drafter


def pretrained_drafter(cfg: RunConfig, target, vocab, layer_ids: list[int], log) -> tuple[torch.nn.Module, dict]:
    """Load --from-pretrained; move its lm_head rows to the run's vocab when the mappings differ."""
    src = load_drafter(cfg.from_pretrained)
    where = f"--from-pretrained {cfg.from_pretrained}"
    if src.config.hidden_size != target.hidden_size:
        raise SpecdraftError(f"hidden size: {where} has H={src.config.hidden_size} but target {target.name} "
                             f"has H={target.hidden_size}; train from scratch for this target")
    if src.config.vocab_size != target.vocab_size:
        raise SpecdraftError(f"vocab size: {where} embeds {src.config.vocab_size} target tokens but target "
                             f"{target.name} has {target.vocab_size}; the drafter belongs to another tokenizer")
    report = {"from_pretrained": str(cfg.from_pretrained), "remapped": False}
    src_vocab = vocab_mod.Vocab(src.d2t.clone(), src.t2d.clone(), {"source": str(cfg.from_pretrained)})
    same = (src_vocab.draft_vocab_size == vocab.draft_vocab_size and torch.equal(src_vocab.d2t, vocab.d2t))
    fam = family_of(src)
    if fam.model_type != cfg.family:
        raise SpecdraftError(f"{where}: a {fam.model_type} drafter, but the run trains --family {cfg.family}; "
                             f"pass --family {fam.model_type} or start from a {cfg.family} drafter")
    check_shape_settings(cfg, fam, src.config, target, vocab, layer_ids, where)
    dcfg = type(src.config).from_dict({**src.config.to_dict(), "draft_vocab_size": vocab.draft_vocab_size,
                                       "aux_layer_ids": list(layer_ids), "verifier": target.name})
    drafter = fam.build(dcfg)
    tensors = ckpt.drafter_tensors(src)
    if not same:
        d = vocab_mod.diff(src_vocab, vocab)
        numbers = (f"token overlap {d['overlap']['count']}/{vocab.draft_vocab_size}, positional matches "
                   f"{d['positional_matches']['count']}/{vocab.draft_vocab_size}")
        if not cfg.remap:
            raise SpecdraftError(f"draft vocab: {where} and --vocab {cfg.vocab} map draft ids differently "
                                 f"({numbers}); pass --remap to move the lm_head rows, or train with the "
                                 "drafter's own mapping")
        target_rows = target.model.get_output_embeddings().weight.detach().float()
        weight, counts = vocab_mod.remap_lm_head(src.lm_head.weight.detach(), src_vocab, vocab, target_rows)
        tensors["lm_head.weight"] = weight
        for name in fam.draft_vocab_rows:          # a family's other draft-id rows (Family.draft_vocab_rows)
            if name != "lm_head.weight":
                tensors[name] = vocab_mod.remap_lm_head(tensors[name], src_vocab, vocab)[0]
        report.update(remapped=True, overlap=d["overlap"]["count"],
                      positional_matches=d["positional_matches"]["count"], **counts)
        log(f"remapped lm_head to {cfg.vocab}: {numbers}; rows carried {counts['carried']}, "
            f"from the target's lm_head {counts['from_target']}, zero {counts['zeros']}")
    tensors["d2t"], tensors["t2d"] = vocab.d2t.clone(), vocab.t2d.clone()
    if dcfg.tie_embeddings_to_target:   # the frozen embeddings are the (new) target's
        tensors["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().float()
    drafter.load_state_dict(tensors, strict=False)
    if list(src.config.aux_layer_ids) != list(layer_ids):
        log(f"note: {where} was trained on aux layers {src.config.aux_layer_ids}; the store has {layer_ids}")
    return drafter.float().train(), report


def check_shape_settings(cfg: RunConfig, fam, src_config, target, vocab, layer_ids: list[int], where: str) -> None:
    """A pretrained drafter keeps its architecture: a setting that would shape a fresh drafter
    otherwise than the defaults (a family's `shape_flags`: --draft-layers 2, --fc-norm) and that the
    drafter does not have is refused, never recorded in config.yaml and silently dropped. The
    family's own checks of the run's settings (in its new_config) run here too."""
    wanted = fam.new_config(target.config, vocab.draft_vocab_size, layer_ids, target.name, cfg).to_dict()
    default = fam.new_config(target.config, vocab.draft_vocab_size, layer_ids, target.name).to_dict()
    kept = src_config.to_dict()
    dropped = [f for f in wanted if wanted[f] != default.get(f) and kept.get(f) != wanted[f]]
    if dropped:
        flags = dict(fam.shape_flags)
        asked = "; ".join(f"{flags.get(f, f)} sets {f} {wanted[f]} but the drafter has {kept.get(f)}"
                          for f in dropped)
        raise SpecdraftError(f"{where}: a pretrained drafter keeps its architecture ({asked}); drop those flags to "
                             "fine-tune it as it is, or train from scratch without --from-pretrained")


def resumed_drafter(cfg: RunConfig, resume_from: Path, vocab, data: TrainData, log) -> torch.nn.Module:
    """The run's latest checkpoint, refused when it was trained with another vocab or other data."""
    drafter = load_drafter(resume_from).train()
    if not torch.equal(drafter.d2t, vocab.d2t):
        raise SpecdraftError(f"draft vocab: checkpoint {resume_from} was trained with another mapping than "
                             f"--vocab {cfg.vocab}; resume with the run's own vocab")
    check_resume_inputs(resume_from, drafter, data)
    log(f"resuming from {resume_from}")
    return drafter


def start_drafter(cfg: RunConfig, resume_from: Path | None, target, vocab, data: TrainData,
                  log) -> tuple[torch.nn.Module, dict | None]:
    """(drafter, remap report or None): resumed, pretrained or fresh, in that order of precedence."""
    if resume_from is not None:
        return resumed_drafter(cfg, resume_from, vocab, data, log), None
    if cfg.from_pretrained:
        return pretrained_drafter(cfg, target, vocab, data.layer_ids, log)
    return fresh_drafter(cfg, target, vocab, data.layer_ids), None
