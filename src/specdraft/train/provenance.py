"""RUN/provenance.json: what produced a run, written by rank 0 when training starts, so a result
can be traced to its code and its machine: package versions, the torch threads and device, the
git commit when specdraft runs from a checkout, the full command line, the host's cores, Python
and the time. A --resume keeps the earlier invocations under "earlier" (newest last)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from specdraft import run_layout
from specdraft.io import write_json

PACKAGES = ("specdraft", "torch", "transformers", "vllm", "safetensors", "datasets")


def package_versions() -> dict:
    """Installed versions; a package that is not installed (vllm, usually) is absent."""
    found = {}
    for name in PACKAGES:
        for dist in (name, f"{name}-cpu") if name == "vllm" else (name,):
            try:
                found[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def git_commit(source: Path = Path(__file__).resolve().parent) -> dict | None:
    """HEAD (and whether the tree has uncommitted changes) of the checkout specdraft runs from;
    None when it is an installed copy or git is missing."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        git("ls-files", "--error-unmatch", "__init__.py")   # tracked here: a checkout, not a venv in some repo
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def provenance(device: torch.device | str, world_size: int = 1) -> dict:
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(sys.argv),
        "packages": package_versions(),
        "python": platform.python_version(),
        "torch": {"threads": torch.get_num_threads(), "device": str(device), "world_size": world_size,
                  "cuda": torch.version.cuda,
                  "gpu": torch.cuda.get_device_name(0) if str(device).startswith("cuda") else None},
        "host": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
    }
    git = git_commit()
    if git is not None:
        record["git"] = git
    return record


def write_provenance(run_dir: Path, device: torch.device | str, world_size: int = 1, resumed: bool = False) -> dict:
    """Write RUN/provenance.json (atomic); on --resume the earlier invocations stay under "earlier"."""
    path = Path(run_dir) / run_layout.PROVENANCE
    record = provenance(device, world_size)
    if resumed and path.is_file():
        try:
            before = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            before = None
        if isinstance(before, dict):
            record["earlier"] = [*before.pop("earlier", []), before]
    write_json(path, record)
    return record
