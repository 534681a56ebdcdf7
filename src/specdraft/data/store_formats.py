"""How a store keeps its hidden states on disk: the formats `capture --store-format` writes.

    bf16     aux [N, n, H] and last [N, H] in the manifest's dtype (bfloat16 by default).
    fp8      aux [N, n, H] and last [N, H] as float8_e4m3fn, with a float32 scale per token row:
             aux_scale [N, n], last_scale [N] (x ~ fp8 * scale, scale = row amax / 448).
    compact  aux as symmetric int4 in groups of G features, two nibbles a byte: aux [N, n, H/2]
             uint8 and aux_scale [N, n, H/G] float16 (x ~ (nibble - 8) * scale, scale = group
             amax / 7); no last hidden state: the teacher's top-k over the target vocabulary
             instead, teacher_ids [N, K] int32 and teacher_logp [N, K] float16 (log-probs).

Training needs the last hidden state only to compute the teacher's distribution over the draft
vocab (train/objective.py TeacherHead), so compact keeps that distribution's head instead: the
draft vocab is chosen after capture, so the top-k is over the whole target vocabulary, and the
mass outside it is spread evenly when the teacher is rebuilt (TeacherHead.log_probs_from_top_k).

Bytes per token (n aux layers, width H, 9 bytes of id and mask):
    bf16     2 (n + 1) H + 9                      (itemsize 2; float32 stores: 4 (n + 1) H + 9)
    fp8      (n + 1) H + 4 (n + 1) + 9
    compact  n H / 2 + 2 n H / G + 6 K + 9        (G = 64, K = 32 by default)

Encoding and decoding are whole-tensor torch ops (no Python loop over tokens).
"""

from __future__ import annotations

import torch

from specdraft.errors import SpecdraftError

FORMATS = ("bf16", "fp8", "compact")
DEFAULT_FORMAT = "bf16"
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0             # largest finite float8_e4m3fn
INT4_MAX = 7                # symmetric int4: -7..7 (nibble 1..15; 0 unused)
FP16_MAX = 65504.0          # largest float16: a compact group scale, so a group's max is at most 7x that
GROUP_SIZES = (64, 32, 16, 8, 4, 2)
DEFAULT_TOPK = 32
TOPK_CHUNK = 1024           # tokens per lm_head matmul when computing the teacher's top-k
SCALE_FLOOR = 1e-12         # a row (group) of zeros gets this scale instead of 0 (no 0/0)


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise SpecdraftError(f"--store-format {name}: unknown; use {', '.join(FORMATS)}")
    return name


def group_size(hidden_size: int) -> int:
    """Features per int4 scale group: the largest of 64, 32, ... 2 that divides H."""
    for g in GROUP_SIZES:
        if hidden_size % g == 0:
            return g
    raise SpecdraftError(f"--store-format compact: hidden size {hidden_size} is odd, so int4 pairs do not fit; "
                         "use --store-format fp8")


def format_fields(name: str, hidden_size: int, topk: int = DEFAULT_TOPK) -> dict:
    """The manifest fields a format adds (what a reader needs to decode it)."""
    check_format(name)
    if name == "compact":
        return {"store_format": name, "group_size": group_size(hidden_size), "teacher_topk": int(topk)}
    return {"store_format": name}


def manifest_format(manifest: dict) -> str:
    """A manifest's store format; stores written before formats existed are bf16."""
    return manifest.get("store_format", DEFAULT_FORMAT)


def bytes_per_token(name: str, hidden_size: int, num_aux: int = 3, itemsize: int = 2, topk: int = DEFAULT_TOPK,
                    ids_bytes: int = 8) -> int:
    """Stored bytes per token of a format (the formulas in this module's docstring)."""
    H, n = hidden_size, num_aux
    if name == "fp8":
        return (n + 1) * H + 4 * (n + 1) + ids_bytes + 1
    if name == "compact":
        return n * H // 2 + 2 * n * (H // group_size(H)) + 6 * topk + ids_bytes + 1
    return (n + 1) * H * itemsize + ids_bytes + 1


# ---------------------------------------------------------------------------- fp8


def fp8_encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., H] -> (fp8 [..., H], float32 scale [...]): one scale per row, amax maps to 448."""
    x = x.float()
    scale = (x.abs().amax(-1) / FP8_MAX).clamp_min(SCALE_FLOOR)          # [...]
    return (x / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_decode(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale[..., None].float()).to(dtype)


# ---------------------------------------------------------------------------- int4


def int4_encode(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., H] -> (packed uint8 [..., H/2], float16 scale [..., H/group]): symmetric int4 per group,
    element 2i in the low nibble and 2i+1 in the high one."""
    x = x.float()
    grouped = x.unflatten(-1, (-1, group))                                 # [..., H/G, G]
    amax = grouped.abs().amax(-1)                                          # [..., H/G]
    if bool((amax > INT4_MAX * FP16_MAX).any()):
        raise SpecdraftError(f"--store-format compact: a hidden state reaches {float(amax.max()):.4g}, beyond what "
                             f"its float16 group scales hold ({INT4_MAX * FP16_MAX:.4g}); use --store-format fp8")
    scale = (amax / INT4_MAX).clamp_min(SCALE_FLOOR).half()                # [..., H/G]
    q = (grouped / scale.float()[..., None]).round().clamp(-INT4_MAX, INT4_MAX).to(torch.uint8) + 8
    q = q.flatten(-2).unflatten(-1, (-1, 2))                               # [..., H/2, 2] nibbles 1..15
    return q[..., 0] | (q[..., 1] << 4), scale


def int4_decode(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(uint8 [..., H/2], float16 [..., H/G]) -> [..., H] in dtype."""
    nibbles = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2)  # [..., H]
    values = nibbles.to(torch.float32) - 8
    grouped = values.unflatten(-1, (scale.shape[-1], -1))                  # [..., H/G, G]
    return (grouped * scale.float()[..., None]).flatten(-2).to(dtype)


# ---------------------------------------------------------------------------- teacher top-k


class TopKTeacher:
    """The target's final RMSNorm and full lm_head: last [N, H] (pre-norm) -> its top-k over the
    target vocabulary, (ids [N, K] int32, log-probs [N, K] float16), in chunks of TOPK_CHUNK tokens
    so the [chunk, V] logits stay small. What a compact store keeps instead of the last hidden state."""

    def __init__(self, norm_weight: torch.Tensor, lm_head: torch.Tensor, eps: float, k: int = DEFAULT_TOPK,
                 device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.norm_weight = norm_weight.detach().to(self.device, torch.float32)   # [H]
        self.lm_head = lm_head.detach().to(self.device, torch.float32)           # [V, H]
        self.eps, self.k = float(eps), int(k)

    @classmethod
    def from_model(cls, model, k: int = DEFAULT_TOPK, device: str | torch.device | None = None) -> "TopKTeacher":
        from specdraft.targets import final_norm

        weight, eps = final_norm(model)
        lm_head = model.get_output_embeddings().weight
        return cls(weight, lm_head, eps, k, device or lm_head.device)

    @torch.no_grad()
    def __call__(self, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids, logps = [], []
        for chunk in last.split(TOPK_CHUNK):
            x = torch.nn.functional.rms_norm(chunk.to(self.device, torch.float32), self.norm_weight.shape,
                                             self.norm_weight, self.eps)          # [c, H]
            logp = torch.log_softmax(x @ self.lm_head.T, dim=-1)                 # [c, V]
            top = logp.topk(self.k, dim=-1)                                      # sorted, largest first
            ids.append(top.indices.to(torch.int32).cpu())
            logps.append(top.values.to(torch.float16).cpu())
        return torch.cat(ids), torch.cat(logps)                                  # [N, K] each


# ---------------------------------------------------------------------------- shards


def encode(manifest: dict, aux: torch.Tensor, last: torch.Tensor, dtype: torch.dtype,
           teacher: TopKTeacher | None = None) -> dict[str, torch.Tensor]:
    """A shard's hidden-state tensors in the manifest's format (aux [N, n, H], last [N, H] in)."""
    name = manifest_format(manifest)
    if name == "fp8":
        aux_q, aux_scale = fp8_encode(aux)
        last_q, last_scale = fp8_encode(last)
        return {"aux": aux_q, "aux_scale": aux_scale, "last": last_q, "last_scale": last_scale}
    if name == "compact":
        if teacher is None:
            raise ValueError("a compact store needs the target's head (TopKTeacher) to keep the teacher's top-k")
        if teacher.k != manifest["teacher_topk"]:
            raise ValueError(f"teacher top-k {teacher.k} but the manifest says {manifest['teacher_topk']}")
        packed, scale = int4_encode(aux, manifest["group_size"])
        ids, logp = teacher(last)
        return {"aux": packed, "aux_scale": scale, "teacher_ids": ids, "teacher_logp": logp}
    return {"aux": aux.to(dtype), "last": last.to(dtype)}


def tensor_layout(manifest: dict, n: int) -> dict[str, tuple[str, list[int]]]:
    """Each hidden-state tensor of a shard of n tokens: (safetensors dtype, shape), for the header check."""
    H, n_aux, name = int(manifest["hidden_size"]), len(manifest["layer_ids"]), manifest_format(manifest)
    if name == "fp8":
        return {"aux": ("F8_E4M3", [n, n_aux, H]), "aux_scale": ("F32", [n, n_aux]),
                "last": ("F8_E4M3", [n, H]), "last_scale": ("F32", [n])}
    if name == "compact":
        k = int(manifest["teacher_topk"])
        return {"aux": ("U8", [n, n_aux, H // 2]), "aux_scale": ("F16", [n, n_aux, H // manifest["group_size"]]),
                "teacher_ids": ("I32", [n, k]), "teacher_logp": ("F16", [n, k])}
    dense = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[manifest["dtype"]]
    return {"aux": (dense, [n, n_aux, H]), "last": (dense, [n, H])}


def decode(manifest: dict, read, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One sample's hidden states from `read(name)` (that tensor's rows of the sample): aux [T, n, H]
    and last [T, H] in dtype, or for compact aux and teacher_ids / teacher_logp [T, K]."""
    name = manifest_format(manifest)
    if name == "fp8":
        return {"aux": fp8_decode(read("aux"), read("aux_scale"), dtype),
                "last": fp8_decode(read("last"), read("last_scale"), dtype)}
    if name == "compact":
        return {"aux": int4_decode(read("aux"), read("aux_scale"), dtype),
                "teacher_ids": read("teacher_ids"), "teacher_logp": read("teacher_logp")}
    return {"aux": read("aux"), "last": read("last")}
