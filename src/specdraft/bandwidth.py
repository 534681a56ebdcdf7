"""The floor of a forward bound by memory bandwidth: the weight bytes it streams over this machine's copy bandwidth.

A forward of a few rows on a CPU reads every weight once whatever the row count (issue 35), so its time cannot fall
below weight bytes / bandwidth; plan and the report read verify times as multiples of it.
"""

from __future__ import annotations

import statistics
import time

import torch

FLOOR_BYTES = 256 << 20         # the copy that measures bandwidth: far beyond any last-level cache


def copy_bandwidth_gbs(nbytes: int = FLOOR_BYTES, repeats: int = 5) -> float:
    """This machine's memory bandwidth as a torch copy of `nbytes` sees it: bytes copied per second (GB/s),
    median of `repeats`, measured now (it depends on the CPU, the memory and what else runs)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)                                                              # first touch
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def streamed_weight_bytes(model) -> int:
    """Bytes of the weights one forward of a row reads: every parameter once (tied ones once), the input
    embedding only where it is the output head too (a lookup reads a row, not the table), and of an MoE
    target's routed experts only the share a token routes to (adapter.active_fraction: Kimi-K2.5 reads
    8 of 384)."""
    from specdraft.adapter import active_fraction, is_expert_weight

    embed = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = head is not None and embed is not None and head.weight.data_ptr() == embed.data_ptr()
    active = active_fraction(model.config) if hasattr(model, "config") else 1.0
    seen, total = set(), 0.0
    for name, p in model.named_parameters():
        if p.data_ptr() in seen or (p is embed and not tied):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size() * (active if is_expert_weight(name) else 1.0)
    return int(total)


def weight_floor(model, bandwidth_gbs: float | None = None) -> dict:
    """The floor of a forward bound by memory bandwidth (issue 35): streamed weight bytes / copy bandwidth.
    A forward of a few rows on a CPU reads every weight once whatever the row count, so its time cannot
    fall below this; verify times are read as multiples of it."""
    bandwidth = bandwidth_gbs or copy_bandwidth_gbs()
    nbytes = streamed_weight_bytes(model)
    return {"weight_mb": nbytes / 1e6, "bandwidth_gbs": bandwidth, "floor_ms": nbytes / bandwidth / 1e6}


def floor_line(floor: dict, verify_ms: list[float] | None = None) -> str:
    """'floor: 538 MB of weights / 19.2 GB/s (copy) = 28.0 ms; verify 1..4 = 2.1 1.9 2.2 2.3x floor'."""
    line = (f"floor: {floor['weight_mb']:.0f} MB of weights / {floor['bandwidth_gbs']:.1f} GB/s (a torch copy, "
            f"measured now) = {floor['floor_ms']:.1f} ms per forward")
    if verify_ms:
        line += f"; verify 1..{len(verify_ms)} = " + " ".join(f"{v / floor['floor_ms']:.1f}" for v in verify_ms) + "x floor"
    return line
