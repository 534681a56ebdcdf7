"""DFlash's training forward: blocks at sampled anchors of a packed batch.

Alignment (the serving round's, docs/DESIGN.md): a block anchored at position a holds token a (the
last accepted one) and K mask slots at positions a+1..a+K; it attends to the context of positions
< a of its own document and to its whole block (non-causal, as vLLM serves DFlash). Slot j drafts
token a+j; its teacher is the target's distribution at position a+j-1 over the draft vocab, exactly
EAGLE-3's prediction of token t+k+2 at position t = a-1, step k = j-1. So the metric sums (and
accept_len) are the same quantities as EAGLE-3's and P-EAGLE's, step k = slot k+1.

Anchors: every position a whose context is non-empty (a-1 in the same document) and whose first
slot is trained. A row trains on up to T/2 of them, drawn at random (a fixed draw in eval mode, so
validation numbers repeat). All blocks of a row run as one sequence of N*(K+1) queries over
[context (T); blocks (N*(K+1))] keys with a boolean mask.
"""

from __future__ import annotations

import torch
from torch import nn

from specdraft.model.dflash.module import DFlashDrafter
from specdraft.train.objective import TeacherHead, add_step_sums, chunked_position_loss, teacher_targets

ANCHOR_SHARE = 2          # a row trains at most T / ANCHOR_SHARE anchors: ~ K+1 queries per 2 tokens


def pick_anchors(doc_ids: torch.Tensor, first_trained: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """[B,T] -> anchor positions [B,N] (-1 pads a row with fewer valid anchors than N)."""
    B, T = doc_ids.shape
    has_context = torch.zeros_like(first_trained)
    has_context[:, 1:] = (doc_ids[:, 1:] == doc_ids[:, :-1]) & (doc_ids[:, 1:] >= 0)
    valid = has_context & first_trained                                          # [B,T]
    n = max(1, min(int(valid.sum(1).max()), T // ANCHOR_SHARE))
    keys = torch.rand(B, T, generator=generator, device="cpu").to(doc_ids.device)
    keys = torch.where(valid, keys, torch.full_like(keys, 2.0))                  # invalid ones sort last
    chosen = keys.topk(n, dim=1, largest=False)                                  # [B,N]
    return torch.where(chosen.values < 2.0, chosen.indices, torch.full_like(chosen.indices, -1)).sort(1).values


def block_mask(doc_ids: torch.Tensor, anchors: torch.Tensor, block: int) -> torch.Tensor:
    """bool [B,1,N*block,T+N*block]: a block's queries see the context before its anchor (same document)
    and every key of their own block. Padding blocks see their own keys only (no NaN rows)."""
    B, T = doc_ids.shape
    N = anchors.shape[1]
    safe = anchors.clamp(min=0)
    anchor_doc = doc_ids.gather(1, safe)                                         # [B,N]
    pos = torch.arange(T, device=doc_ids.device)
    context = (pos[None, None] < safe[..., None]) & (doc_ids[:, None] == anchor_doc[..., None])   # [B,N,T]
    context &= (anchors >= 0)[..., None]
    own = torch.eye(N, dtype=torch.bool, device=doc_ids.device)                  # [N,N] same block
    own = own.repeat_interleave(block, 0).repeat_interleave(block, 1)            # [N*b, N*b]
    context = context.repeat_interleave(block, 1)                                # [B,N*b,T]
    return torch.cat([context, own.expand(B, -1, -1)], dim=-1)[:, None]


def dflash_forward(drafter: DFlashDrafter, teacher: TeacherHead, batch: dict[str, torch.Tensor], slots: int = 3,
                   step_decay: float = 1.0, loss: str = "kl", aux_noise: float = 0.0,
                   generator: torch.Generator | None = None,
                   on_slot=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Blocks of `slots` drafts over a packed batch -> (loss, metric sums); loss = sum_k step_decay**k *
    mean position_loss of slot k+1 over its trained predictions. Slot k+1's logits come from
    `drafter.slot_logits` given token a+k (teacher forcing: the token before the one it drafts).
    `on_slot(k, out, out_rows, prev_ids, correct, is_trained, sums)` -> an extra loss term (DSpark's
    confidence head), or None."""
    input_ids, doc_ids, loss_mask = batch["input_ids"], batch["doc_ids"], batch["loss_mask"].bool()
    position_ids = batch["position_ids"]
    B, T = input_ids.shape
    block = slots + 1
    teacher_logp, teacher_top, compact_index = teacher_targets(teacher, batch)

    def ahead(j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """bool [B,T] at anchor a: token a+j exists in a's document (has a teacher), and it is loss-masked."""
        same = torch.zeros_like(loss_mask)
        same[:, :T - j] = (doc_ids[:, j:] == doc_ids[:, :T - j]) & (doc_ids[:, :T - j] >= 0)
        trained = torch.zeros_like(loss_mask)
        trained[:, :T - j] = loss_mask[:, j:]
        return same, same & trained

    anchors = pick_anchors(doc_ids, ahead(1)[1], generator)                       # [B,N]
    N = anchors.shape[1]
    safe = anchors.clamp(min=0)
    aux = batch["aux"].to(drafter.fc.weight.dtype)                                # [B,T,n_aux,H]
    if aux_noise > 0 and drafter.training:
        aux = aux + (torch.rand_like(aux) * 2 - 1) * aux_noise
    context_kv = drafter.context_kv(aux, position_ids)
    offsets = torch.arange(block, device=input_ids.device)
    tokens = torch.full((B, N, block), drafter.config.mask_token_id, dtype=torch.long, device=input_ids.device)
    tokens[..., 0] = input_ids.gather(1, safe)                                    # the anchor token
    positions = position_ids.gather(1, safe)[..., None] + offsets                 # [B,N,block]
    out = drafter.decode(tokens.flatten(1), positions.flatten(1), context_kv,
                         block_mask(doc_ids, anchors, block))                     # [B,N*block,H]

    total = out.new_zeros((), dtype=torch.float32)
    sums = {}
    real = (anchors >= 0).flatten()                                               # [B*N]
    through = torch.ones(B * N, dtype=torch.bool, device=input_ids.device)
    flat_anchor = (torch.arange(B, device=input_ids.device)[:, None] * T + safe).flatten()   # [B*N] flat b*T+a
    for k in range(slots):                                                        # slot k+1 drafts token a+k+1
        defined, trained = (m.flatten()[flat_anchor] & real for m in ahead(k + 1))
        anchor_rows = defined.nonzero().squeeze(1)                                # [R] into the B*N anchors
        is_trained = trained[anchor_rows]
        out_rows = (anchor_rows // N) * N * block + (anchor_rows % N) * block + k + 1   # flat rows of out
        prev_ids = input_ids.flatten()[flat_anchor[anchor_rows] + k]             # [R] token a+k
        logits = drafter.slot_logits(out, out_rows, prev_ids)                    # [R, Vd]
        t_rows = compact_index[flat_anchor[anchor_rows] + k]                      # teacher at a+k
        t_top = teacher_top[t_rows]
        per_pos, top = chunked_position_loss(logits, teacher_logp, t_rows, t_top, loss)
        per_pos = per_pos[is_trained]
        total = total + (step_decay ** k) * per_pos.sum() / max(per_pos.numel(), 1)
        correct = top == t_top
        add_step_sums(sums, k, per_pos, correct, through, anchor_rows, is_trained)
        extra = on_slot(k, out, out_rows, prev_ids, correct, is_trained, sums) if on_slot is not None else None
        if extra is not None:
            total = total + extra
    return total, sums


class DFlashObjective(nn.Module):
    """drafter + teacher + settings behind one forward(batch) -> (loss, sums), for DDP / FSDP."""

    def __init__(self, drafter: DFlashDrafter, teacher: TeacherHead, slots: int = 3, step_decay: float = 1.0,
                 loss: str = "kl", aux_noise: float = 0.0):
        super().__init__()
        self.drafter, self.teacher = drafter, teacher
        self.slots, self.step_decay, self.loss, self.aux_noise = slots, step_decay, loss, aux_noise

    def forward(self, batch: dict[str, torch.Tensor]):
        # eval draws the same anchors every time, so validation numbers repeat
        generator = None if self.training else torch.Generator().manual_seed(0)
        return dflash_forward(self.drafter, self.teacher, batch, self.slots, self.step_decay, self.loss,
                              self.aux_noise if self.training else 0.0, generator)
