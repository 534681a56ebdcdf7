"""Drafter checkpoints on disk: our layout (speculators, which vLLM serves directly), the
SGLang layout, and the official EAGLE-3 repo layout; export and import between them.

Everything here works on (tensors dict with canonical names, the family's config); what a
family's config.json and tensors hold is the family's own (model/<family>/, found through
families.py). The SGLang and EAGLE-repo layouts hold EAGLE-3 drafters only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch

from specdraft.defaults import DRAFT_LENGTH
from specdraft.errors import SpecdraftError
from specdraft import run_layout
from specdraft.families import Layout, family, family_of, layout as layout_of, layouts, names
from specdraft.formats import card
from specdraft.io import clean_leftovers, fsync_dir, os_error_line, read_json, temp_prefix, with_umask, write_json
from specdraft.outputs import LOCK_NAME
from specdraft.schemas.drafter import check_drafter_config
from specdraft.schemas.exports import RECORD
from specdraft.targets import load_target_head
from specdraft.vocab import check_mapping, integer_d2t, t2d_from_d2t
from specdraft.weights import WEIGHT_FILES, read_weights, weights_file

IGNORED_KEYS = ("verifier_norm.weight", "verifier_lm_head.weight")  # older speculators saves


def written_layouts() -> list[str]:
    """What --format takes: speculators, or any registered family's other layout (EAGLE-3: sglang)."""
    return ["speculators", *sorted({lay.name for _fam, lay in layouts()})]


def check_format(layout: str) -> None:
    if layout not in written_layouts():
        raise SpecdraftError(f"--format {layout}: unknown; choose one of {', '.join(written_layouts())}")


def checkpoint_dtype(tensors: dict[str, torch.Tensor]) -> str:
    """The drafter's weight dtype as config.json names it ('bfloat16'), from fc or lm_head."""
    t = tensors.get("fc.weight", tensors.get("lm_head.weight"))
    return str(t.dtype).removeprefix("torch.") if t is not None else "float32"


def verifier_architectures(verifier: str) -> list[str]:
    """The verifier's architectures when it is a local folder, or the GGUF specdraft dequantized for that
    name (the embedded default's hub id); [] otherwise (no network here)."""
    from specdraft.targets import dequantized_source

    local = dequantized_source(verifier) if verifier else None
    folder = local[0] if local else Path(verifier) if verifier else None
    if folder is not None and (folder / "config.json").is_file():
        try:
            config = read_json(folder / "config.json")
        except SpecdraftError:
            return []
        names = config.get("architectures") if isinstance(config, dict) else None
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return list(names)      # a string or a list of other things says nothing: none is recorded
    return []


def _plain_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous, no shared storage (safetensors refuses aliasing tensors)."""
    seen: set[int] = set()
    out = {}
    for k, v in tensors.items():
        v = v.detach().cpu().contiguous()
        ptr = v.untyped_storage().data_ptr()
        if ptr in seen:
            v = v.clone()
        seen.add(v.untyped_storage().data_ptr())
        out[k] = v
    return out


def _write_folder_atomically(folder: Path, write: Callable[[Path], None]) -> None:
    """Write everything into a temp sibling, fsync, then swap it in: a failure leaves `folder` as it was."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise SpecdraftError(f"{folder}: exists and is not a folder; choose another --out")
    if (folder.is_dir() and any(p.name != LOCK_NAME for p in folder.iterdir())
            and not (folder / "config.json").exists()):
        raise SpecdraftError(f"{folder}: not empty and not a checkpoint; refusing to replace it, "
                             "choose an empty or new --out")
    folder.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(folder.parent)   # a killed earlier write: its temp folder, or the previous result set aside
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(folder.name), suffix=".tmp", dir=folder.parent))
    os.chmod(tmp, with_umask(0o777))   # mkdtemp makes 0700: a serving engine running as another user reads it
    old = None
    try:
        write(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                os.chmod(f, with_umask(0o666))   # safetensors writes 0600: others could not read the export
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
        fsync_dir(tmp)
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=temp_prefix(folder.name), suffix=".old", dir=folder.parent))
            os.replace(folder, old / folder.name)
        os.replace(tmp, folder)
        fsync_dir(folder.parent)
    except BaseException as e:
        if old is not None and not folder.exists():
            os.replace(old / folder.name, folder)  # put the previous checkpoint back
        cause = e.__cause__ if isinstance(e, SpecdraftError) else e   # atomic_path names its temp file
        line = os_error_line(folder, cause) if isinstance(cause, Exception) else None
        if line is None:
            raise
        raise SpecdraftError(line) from cause
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def draft_length(cfg, requested: int | None, trained: int | None = None) -> int:
    """The num_speculative_tokens a checkpoint of `cfg` is written with: the one asked for, else the
    drafter's own (`trained`: the draft positions its run trained, card.trained_depth), else DRAFT_LENGTH;
    never beyond what its family trained it to draft (Family.max_draft: a block's slots). A machine's
    measured K (bench -k auto) is the machine's, not the drafter's: an export goes to another machine."""
    limit = family_of(cfg).max_draft(cfg)
    if requested is None:
        own = trained or DRAFT_LENGTH
        return min(own, limit or own)
    if limit is not None and requested > limit:
        raise SpecdraftError(f"-k {requested}: this {family_of(cfg).model_type} drafter was trained to draft "
                             f"{limit} tokens per round; export with -k {limit} or less")
    return requested


def save_checkpoint(folder: str | Path, tensors: dict[str, torch.Tensor], cfg,
                    layout: str = "speculators", speculative_tokens: int | None = None,
                    extra_files: dict[str, Callable[[Path], None]] | None = None) -> Path:
    """Write a drafter checkpoint folder (config.json + model.safetensors), atomically.

    `tensors` use canonical names; `extra_files` maps a file name to a function that writes it
    (e.g. optimizer state), so it lands inside the same atomic swap. `speculative_tokens`: the K the
    caller resolved with draft_length (export's -k); None writes the family's default."""
    from safetensors.torch import save_file

    folder = Path(folder)
    check_format(layout)
    tensors = _plain_tensors(tensors)
    fam = family_of(cfg)
    fam.validate(tensors, cfg, str(folder))
    dtype = checkpoint_dtype(tensors)
    other = layout_of(fam, layout)
    if layout == "speculators":
        k = draft_length(cfg, None) if speculative_tokens is None else speculative_tokens
        config = fam.checkpoint_config(cfg, dtype, k, verifier_architectures(cfg.verifier))
        on_disk = tensors
    elif other is None:
        raise SpecdraftError(f"--format {layout}: a {fam.model_type} drafter has no {layout} layout; "
                             "export --format speculators")
    else:
        config, on_disk = other.write(cfg, tensors, dtype, str(folder))

    def write(tmp: Path) -> None:
        save_file(on_disk, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_json(tmp / "config.json", config)
        for name, writer in (extra_files or {}).items():
            writer(tmp / name)

    _write_folder_atomically(folder, write)
    return folder


def detect_layout(folder: Path, config: dict | None = None) -> str:
    """'speculators', or the name a family's other layout gives it ('sglang', 'eagle'), or fail
    listing what was looked for."""
    return _detect(folder, config)[0]


def _detect(folder: Path, config: dict | None = None) -> tuple[str, Layout | None]:
    others = "".join(f", or {lay.looks_like or lay.name}" for _fam, lay in layouts())
    looked_for = (f"config.json with speculators_model_type {' or '.join(map(repr, names()))} (speculators/vLLM)"
                  f"{others}, plus " + " or ".join(WEIGHT_FILES))
    if not folder.is_dir():
        raise SpecdraftError(f"{folder}: not a folder; expected a drafter checkpoint ({looked_for})")
    if config is None:
        if not (folder / "config.json").exists():
            raise SpecdraftError(f"{folder}: unknown checkpoint layout: no config.json; looked for {looked_for}")
        config = read_json(folder / "config.json", "drafter config")
    check_drafter_config(config, folder)
    weights = weights_file(folder)
    if weights is None:
        raise SpecdraftError(f"{folder}: unknown checkpoint layout: no weights; looked for {looked_for}")
    if "speculators_model_type" in config:
        if config["speculators_model_type"] not in names():
            raise SpecdraftError(f"{folder}: speculators_model_type {config['speculators_model_type']!r} is not "
                                 f"supported; registered drafter families: {', '.join(names())}")
        return "speculators", None
    for _fam, lay in layouts():
        found = lay.detect(config, weights)
        if found:
            return found, lay
    raise SpecdraftError(f"{folder}: unknown checkpoint layout (architectures {config.get('architectures')}); "
                         f"looked for {looked_for}")


def load_checkpoint(folder: str | Path) -> tuple[dict[str, torch.Tensor], object, str]:
    """Read any supported layout -> (tensors with canonical names, the family's config, layout)."""
    folder = Path(folder)
    config = read_json(folder / "config.json", "drafter config") if (folder / "config.json").is_file() else None
    layout, other = _detect(folder, config)
    tensors = read_weights(folder)
    for k in IGNORED_KEYS:
        tensors.pop(k, None)
    where = str(folder)
    if other is None:
        cfg = family(config["speculators_model_type"]).parse_config(config, where)
    else:
        tensors, cfg = other.read(config, tensors, where)
    if "d2t" in tensors:
        tensors["d2t"] = integer_d2t(tensors["d2t"], where, "save the drafter's d2t as int64 (re-export it)")
        if "t2d" in tensors:
            tensors["t2d"] = tensors["t2d"].to(torch.bool)
        elif tensors["d2t"].numel() != cfg.vocab_size:
            check_mapping(tensors["d2t"], None, where, cfg.vocab_size)
            tensors["t2d"] = t2d_from_d2t(tensors["d2t"], cfg.vocab_size)
    check_counts(cfg, folder / "config.json")
    family_of(cfg).validate(tensors, cfg, where)
    check_finite(tensors, weights_file(folder))
    return tensors, cfg, layout


COUNTS = {"hidden_size": 1, "intermediate_size": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
          "head_dim": 1, "vocab_size": 1, "draft_vocab_size": 1, "num_layers": 1, "block_size": 2}


def check_counts(cfg, config_json: Path) -> None:
    """Every size a drafter config holds is a whole number at least its minimum (a block holds the anchor and a
    draft slot): a 0 exported a negative speculative_tokens and drafted nothing."""
    for name, least in COUNTS.items():
        value = getattr(cfg, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise SpecdraftError(f"{config_json}: {name} is {value!r}; a {family_of(cfg).model_type} drafter needs a "
                                 f"whole number >= {least}: fix config.json or re-export the drafter")


def check_finite(tensors: dict[str, torch.Tensor], weights: Path) -> None:
    """Refuse a drafter holding NaN/inf: it still drafts (greedy output stays lossless) but accepts
    nothing, so eval would report 0 acceptance as a fact and export would ship it."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise SpecdraftError(f"{weights}: tensor '{name}' holds NaN/inf; this drafter is broken "
                                 "(training diverged?): use an earlier checkpoint or retrain")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a run folder: its best/ checkpoint, else the newest checkpoints/epoch-N/."""
    path = Path(path)
    if not path.exists():
        raise SpecdraftError(f"{path}: not found; pass a checkpoint folder or a run folder WS/runs/NAME")
    if (path / "config.json").is_file():
        return path
    if (run_layout.best_dir(path) / "config.json").is_file():
        return run_layout.best_dir(path)
    epochs = run_layout.checkpoints(path, "epoch")
    if epochs:
        return epochs[-1][2]
    raise SpecdraftError(f"{path}: no checkpoint found (looked for {path}/config.json, {path}/best/, "
                         f"{path}/checkpoints/epoch-N/)")


READ_TRIES = 5      # reads of a checkpoint that a writer swapped meanwhile, before giving up


def folder_stamp(folder: Path) -> tuple | None:
    """What changes when a checkpoint folder is written or swapped whole (train replaces RUN/best/ by a rename
    at each new best): the folder's inode and each file's size and mtime. None while it is missing."""
    try:
        return folder.stat().st_ino, tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                                  for f in folder.iterdir() if f.is_file()))
    except FileNotFoundError:
        return None


def stable_read(src: str | Path, read):
    """(the checkpoint of `src`, read(checkpoint)) from one version of it: a read during which a running train
    swapped the folder (an export of RUN while it finds a new best) is read again, so an export never mixes two
    epochs or records an epoch it did not export."""
    for _ in range(READ_TRIES):
        ckpt = resolve_checkpoint(src)
        before = folder_stamp(ckpt)
        try:
            result = read(ckpt)
        except (SpecdraftError, OSError):
            if folder_stamp(ckpt) == before:
                raise
            continue                        # a file vanished or was cut mid-swap: read the new version
        if before is not None and folder_stamp(ckpt) == before:
            return ckpt, result
    raise SpecdraftError(f"{src}: its checkpoint changed {READ_TRIES} times while being read (a training run "
                         "saving into it?); export when training stops, or export a checkpoints/epoch-N folder")


EXPORT_FILES = ("config.json", "model.safetensors", "README.md", "inputs.json", RECORD)   # what export and import write


def check_replaceable(out: Path, command: str) -> None:
    """export and import swap in a whole new --out folder, deleting what it held: allow that over a
    previous export only. A training checkpoint (its trainer_state.pt), a run, a store or anything
    else is refused with one line saying what the folder holds."""
    if not out.is_dir():
        return
    names = sorted((p.name for p in out.iterdir() if p.name not in (*EXPORT_FILES, LOCK_NAME)),
                   key=lambda name: (name.startswith("."), name))   # hidden files (.journal.lock) last
    if not names:
        return
    if {"trainer_state.pt", "progress.json"} & set(names):
        what = "a training checkpoint"
    elif set(run_layout.RUN_FILES[:4]) & set(names):
        what = "a training run"
    elif "manifest.json" in names:
        what = "a hidden-state store"
    else:
        what = "files that are not an export"
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    raise SpecdraftError(f"{out}: holds {what} ({shown}); {command} replaces --out whole and would delete "
                         "it; choose an empty or new --out")


EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                 "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_EXPORT_DTYPE = "bfloat16"   # what vLLM and SGLang serve; fp32 doubles the file for nothing


def export_dtype(name: str) -> torch.dtype:
    if name not in EXPORT_DTYPES:
        raise SpecdraftError(f"--weights-dtype {name}: unknown; choose bfloat16 (default, what engines serve), "
                             "float16 or float32")
    return EXPORT_DTYPES[name]


def cast_floats(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors to `dtype`; d2t (int64) and t2d (bool) keep theirs."""
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in tensors.items()}


def check_embeddings_shared(tensors: dict[str, torch.Tensor], model: str | None, where: str):
    """--no-embeddings: the drafter's embeddings must equal the target's (compared in the drafter's
    dtype), since engines then use the target's. Returns the target (identity for the card)."""
    if not model:
        raise SpecdraftError("--no-embeddings: pass the target (--model) so the drafter's embeddings can be "
                             "checked against the ones engines will use instead")
    target = load_target_head(model, dtype="float32")
    mine = tensors.get("embed_tokens.weight")
    if mine is None:
        return target   # already without (an SGLang/EAGLE import): nothing to drop
    theirs = target.model.get_input_embeddings().weight.detach()
    if mine.shape != theirs.shape or not torch.equal(mine, theirs.to(mine.dtype)):
        what = (f"shape {list(mine.shape)} vs {list(theirs.shape)}" if mine.shape != theirs.shape
                else f"{int((mine != theirs.to(mine.dtype)).any(-1).sum())} rows differ")
        raise SpecdraftError(f"--no-embeddings: {where}'s embeddings differ from {target.name}'s ({what}); "
                             "engines would use the target's: export without --no-embeddings (or pass the "
                             "target it was trained on)")
    return target


def export(src: str | Path, out: str | Path, layout: str, speculative_tokens: int | None = None,
           dtype: str = DEFAULT_EXPORT_DTYPE, embeddings: bool = True, model: str | None = None) -> dict:
    """Re-write a checkpoint (or a run's best/newest one) in a serving engine's layout, in `dtype`,
    with a README.md model card. embeddings=False drops embed_tokens after checking that they
    equal the target's (`model`), which vLLM and SGLang then use."""
    torch_dtype = export_dtype(dtype)
    check_format(layout)
    ckpt = resolve_checkpoint(src)
    out = Path(out)
    if out.resolve() == ckpt.resolve():
        raise SpecdraftError(f"--out {out}: is the source checkpoint; choose another folder")
    check_replaceable(out, "export")
    ckpt, (tensors, cfg, src_layout, depth, position, inputs) = stable_read(src, lambda c: (
        *load_checkpoint(c), card.trained_depth(c), card.checkpoint_position(c), card.training_inputs(c)))
    speculative_tokens = draft_length(cfg, speculative_tokens, depth)
    target = None
    if not embeddings:
        target = check_embeddings_shared(tensors, model, str(ckpt))
        tensors.pop("embed_tokens.weight", None)
    tensors = cast_floats(tensors, torch_dtype)
    dtype_name = str(torch_dtype).removeprefix("torch.")
    weight_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    text = card.render(card.facts(ckpt, cfg, target.identity if target else None), cfg, out=out, layout=layout,
                       dtype=dtype_name, embeddings="embed_tokens.weight" in tensors,
                       speculative_tokens=speculative_tokens, weight_bytes=weight_bytes)
    record = card.export_record(ckpt, out, layout, dtype_name, speculative_tokens, position)
    extra = {"README.md": lambda p: p.write_text(text), RECORD: lambda p: write_json(p, record)}
    if inputs:                              # eval of the export leaves out the samples it trained on
        extra["inputs.json"] = lambda p: write_json(p, inputs)
    save_checkpoint(out, tensors, cfg, layout=layout, speculative_tokens=speculative_tokens, extra_files=extra)
    return {"source": str(ckpt), "source_layout": src_layout, "layout": layout, "out": str(out),
            "dtype": dtype_name, "tensors": len(tensors), "has_embed_tokens": "embed_tokens.weight" in tensors,
            "weight_bytes": weight_bytes}


def import_checkpoint(src: str | Path, out: str | Path) -> dict:
    """Any supported layout -> ours (speculators)."""
    src, out = Path(src), Path(out)
    if out.exists() and out.resolve() == src.resolve():
        raise SpecdraftError(f"--out {out}: is the source checkpoint; choose another folder")
    check_replaceable(out, "import")
    tensors, cfg, layout = load_checkpoint(src)
    save_checkpoint(out, tensors, cfg, layout="speculators")
    return {"source": str(src), "source_layout": layout, "out": str(out), "tensors": len(tensors),
            "has_embed_tokens": "embed_tokens.weight" in tensors, "aux_layer_ids": list(cfg.aux_layer_ids)}


# ----------------------------------------------------------------------------- drafter objects

def save_drafter(model: torch.nn.Module, folder, layout: str = "speculators") -> None:
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()
               if not k.startswith("rotary_emb")}
    save_checkpoint(folder, tensors, model.config, layout=layout)


def load_drafter(folder, dtype: torch.dtype = torch.float32, target_model=None) -> torch.nn.Module:
    """Load any supported layout. Drafters shipped without `embed_tokens` (SGLang/EAGLE exports
    usually are) take the target's embeddings, which is what they were trained against."""
    tensors, cfg, _layout = load_checkpoint(folder)
    if "embed_tokens.weight" not in tensors:
        if target_model is None:
            raise SpecdraftError(f"{folder}: checkpoint has no embed_tokens.weight; pass the target "
                                 "(--model) so its embeddings can be used")
        tensors["embed_tokens.weight"] = target_model.get_input_embeddings().weight.detach().float()
    model = family_of(cfg).build(cfg)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.startswith("rotary_emb")]
    if missing or unexpected:
        raise SpecdraftError(f"{folder}: checkpoint tensors do not match the drafter "
                             f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
    return model.to(dtype).eval()


def export_line(summary: dict, out, layout: str) -> str:
    """What `specdraft export` prints."""
    shared = "" if summary["has_embed_tokens"] else ", no embeddings: engines use the target's"
    return (f"exported {summary['source']} ({summary['source_layout']}) -> {out} ({layout}, {summary['dtype']}, "
            f"{summary['weight_bytes'] / 1e6:.1f} MB{shared}; model card README.md)")


def import_lines(summary: dict, src, out) -> list[str]:
    """What `specdraft import` prints: the copy, and what the source left out."""
    lines = [f"imported {src} ({summary['source_layout']}) -> {out}"]
    if not summary["has_embed_tokens"]:
        lines.append("note: no embed_tokens in the source; they are the target's (copy them before training)")
    if not summary["aux_layer_ids"]:
        lines.append("note: the source names no aux layer ids; engines use their default [2, L//2, L-3]")
    return lines
