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
            wmap = read_json(path, "safetensors index").get("weight_map") or {}
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
