"""This machine's identity as a timing sees it: the CPU's model name and flags, its vector kind, torch and threads.

A measured choice (kernels.py's per-Linear paths, dtypes.py's compute dtype) holds for the machine it was timed
on: these are what the caches key on and what a benchmark names beside every timing it reports.
"""

from __future__ import annotations

import hashlib
import platform
from functools import lru_cache
from pathlib import Path

import torch


def cpu_identity() -> dict:
    """What the fastest kernel depends on, besides the shape."""
    return {**cpu_info(), "torch": torch.__version__, "threads": torch.get_num_threads()}


@lru_cache(maxsize=1)
def cpu_info() -> dict:
    name, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.strip()
    except OSError:
        pass
    return {"cpu": name, "flags_sha": hashlib.sha256(flags.encode()).hexdigest()[:12],
            "avx512": "avx512f" in flags.split(), "avx512_bf16": "avx512_bf16" in flags.split(),
            "amx": "amx_tile" in flags.split()}


def vector_isa(info: dict | None = None) -> str:
    """This CPU's widest matrix/vector kind: amx, avx512-bf16, avx512 or avx2 (what timings depend on)."""
    info = info or cpu_info()
    return "amx" if info["amx"] else ("avx512-bf16" if info["avx512_bf16"] else "avx512") if info["avx512"] else "avx2"


def cpu_label() -> str:
    """The CPU's model name and vector kind, named beside every timing a benchmark reports."""
    return f"{cpu_info()['cpu']} ({vector_isa()})"
