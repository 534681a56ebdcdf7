"""Weights files as the official EAGLE-3 repo and Hugging Face write them: model.safetensors,
a sharded model.safetensors.index.json, or pytorch_model.bin (read with weights_only=True, so a
pickle can never run code)."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from specdraft.errors import SpecdraftError
from specdraft.io import read_json

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def weights_file(folder: Path) -> Path | None:
    for name in WEIGHT_FILES:
        if (folder / name).exists():
            return folder / name
    return None


def plain_file_name(name: object) -> bool:
    """True for a file name with no folder part (what an index or manifest entry may hold)."""
    return (isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name
            and name not in (".", "..") and not Path(name).is_absolute() and Path(name).name == name)


def index_weight_map(path: Path) -> dict[str, str]:
    """The weight_map of a model.safetensors.index.json, checked entry by entry: every value is
    a plain file name inside the checkpoint folder, so no entry can read `../../x` or `/etc/x`."""
    index = read_json(path, "safetensors index")
    wmap = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise SpecdraftError(f"{path}: field 'weight_map' must be a non-empty object of tensor name -> file "
                             "name; re-export the checkpoint")
    for tensor, file in wmap.items():
        if not plain_file_name(file):
            raise SpecdraftError(f"{path}: weight_map entry {tensor!r} -> {file!r} points outside the "
                                 "checkpoint folder; entries must be plain file names such as "
                                 "model-00001-of-00002.safetensors")
    return wmap


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = weights_file(folder)
    if path is None:
        raise SpecdraftError(f"{folder}: no weights ({', '.join(WEIGHT_FILES)})")
    try:
        if path.name == "model.safetensors":
            return load_file(str(path))
        if path.name.endswith(".index.json"):
            wmap = index_weight_map(path)
            out: dict[str, torch.Tensor] = {}
            for shard in sorted(set(wmap.values())):
                out.update(load_file(str(folder / shard)))
            return out
    except (SafetensorError, OSError) as e:
        raise SpecdraftError(f"{path}: unreadable safetensors ({e}); re-export the checkpoint") from None
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecdraftError(f"{path}: cannot read as plain tensors ({first}); only weights-only .bin files "
                             "are accepted") from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise SpecdraftError(f"{path}: expected a dict of tensors (a state_dict)")
    return sd
