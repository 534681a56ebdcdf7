"""What every drafter family's training forward shares: the teacher head (the target's final norm
and lm_head rows over the draft vocab), the per-position losses, and the metric sums.

Metric sums are plain 0-dim float64 tensors (numerators and denominators), so batches and ranks
add them up (`add_sums`, or an all_reduce) and `finalize_metrics` turns them into rates: per
draft step k, loss_sum_k / count_k and the full / conditional acceptance. Each family's objective
(model/FAMILY/objective.py, reached through Family.objective) uses them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.targets import final_norm

ATTENTION = ("sdpa", "flex")   # sdpa: boolean TTT mask (any device); flex: BlockMask + flex_attention (CUDA)
LOSSES = ("kl", "ce", "tv", "jsd")
TTT_INPUTS = ("data", "draft")  # the token step k>0 reads: the data's (teacher forcing) or the drafter's own


class TeacherHead(nn.Module):
    """The target's final RMSNorm and its lm_head rows for the draft vocab: [N, H].

    Kept as buffers (never trained); `log_probs(last)` gives the teacher distribution over the
    draft vocab, renormalised (log_softmax over the N draft logits only).
    """

    def __init__(self, norm_weight: torch.Tensor, lm_head_rows: torch.Tensor, eps: float,
                 draft_of_target: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("norm_weight", norm_weight.detach().float().clone())     # [H]
        self.register_buffer("lm_head", lm_head_rows.detach().float().clone())        # [N, H]
        # [V] draft id of each target token, -1 off the draft vocab: reads a compact store's top-k
        self.register_buffer("draft_of_target", draft_of_target, persistent=False)
        self.eps = float(eps)

    @classmethod
    def from_target(cls, target_model: nn.Module, d2t: torch.Tensor) -> "TeacherHead":
        """Final norm + lm_head rows of the draft tokens (target_id = draft_id + d2t[draft_id])."""
        norm_weight, eps = final_norm(target_model)
        draft_to_target = torch.arange(d2t.numel()) + d2t.to(torch.long)
        lm_head = target_model.get_output_embeddings().weight
        draft_of_target = torch.full((lm_head.shape[0],), -1, dtype=torch.long)
        draft_of_target[draft_to_target] = torch.arange(d2t.numel())
        return cls(norm_weight, lm_head[draft_to_target], eps, draft_of_target)

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        """last [..., H] (pre-norm) -> draft-vocab logits [..., N]."""
        x = F.rms_norm(last.float(), self.norm_weight.shape, self.norm_weight, self.eps)   # [..., H]
        return F.linear(x, self.lm_head)

    def log_probs(self, last: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits(last).float(), dim=-1)

    def log_probs_from_top_k(self, ids: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """A compact store's teacher, top-k target ids [M, K] and their log-probs [M, K] -> log-probs
        over the draft vocab [M, N]: the top-k entries that are draft tokens keep theirs, every other
        draft token gets an even share of the mass outside the top-k, renormalised over the draft vocab."""
        M, K = ids.shape
        N, V = self.lm_head.shape[0], self.draft_of_target.numel()
        logp = logp.float()
        outside = (1 - logp.exp().sum(-1)).clamp_min(1e-12) / max(V - K, 1)          # [M] each tail token
        dense = outside.log()[:, None].expand(M, N).clone()                          # [M, N]
        draft = self.draft_of_target[ids.long()]                                     # [M, K], -1 off vocab
        keep = draft >= 0
        rows = torch.arange(M, device=ids.device)[:, None].expand(M, K)
        dense[rows[keep], draft[keep]] = logp[keep]
        return torch.log_softmax(dense, dim=-1)


def shift_left(x: torch.Tensor, n: int, fill) -> torch.Tensor:
    """x[:, t] <- x[:, t+n] along dim 1, the last n entries set to `fill`."""
    if n == 0:
        return x
    out = torch.full_like(x, fill)
    out[:, :-n] = x[:, n:]
    return out


def in_document(doc_ids: torch.Tensor, step: int) -> torch.Tensor:
    """bool [B,T]: token t+step+2 exists in the same document as t (so the prediction has a teacher)."""
    ahead = step + 2
    return (shift_left(doc_ids, ahead, -1) == doc_ids) & (doc_ids >= 0)


def valid_positions(doc_ids: torch.Tensor, loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """bool [B,T]: the prediction of token t+step+2 at position t is trained (same document,
    loss-masked, not padding)."""
    return in_document(doc_ids, step) & shift_left(loss_mask.bool(), step + 2, False)


def add_sums(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if a is None:
        return {k: v.detach().clone() for k, v in b.items()}
    return {k: a[k] + b[k].detach() for k in b}


def finalize_metrics(sums: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """Sums -> {loss_k, full_acc_k, cond_acc_k, loss (mean over steps), accept_len}.

    full_acc_k = correct at every step 0..k / trained at k; cond_acc_k = same numerator /
    trained at k and correct through k-1; accept_len = 1 + sum_k prod_{i<=k} cond_acc_i.
    """
    steps = len([k for k in sums if k.startswith("count_")])
    out: dict[str, float] = {}
    losses, prod, accept = [], 1.0, 1.0
    for k in range(steps):
        count = float(sums[f"count_{k}"])
        prev = float(sums[f"prev_correct_{k}"])
        full = float(sums[f"full_correct_{k}"])
        out[f"loss_{k}"] = float(sums[f"loss_sum_{k}"]) / count if count else float("nan")
        out[f"full_acc_{k}"] = full / count if count else 0.0
        out[f"cond_acc_{k}"] = full / prev if prev else 0.0
        losses.append(out[f"loss_{k}"])
        prod *= out[f"cond_acc_{k}"]
        accept += prod
    out["loss"] = sum(losses) / len(losses) if losses else float("nan")
    out["accept_len"] = accept
    return out


TEACHER_HOLD_BYTES = 512 * 2**20   # the teacher's fp32 log-probs over the draft vocab held at once up to this size
                                   # (16K rows of an 8192-token vocab); a longer row has them computed chunk by chunk
                                   # where a step's loss reads them (each step computes them again: slower, bounded)


class TeacherRows:
    """The teacher's log-probs over the draft vocab at the positions t' whose next token is in the
    document, indexed like a tensor [M, N] (`teacher_logp[rows]`). Up to TEACHER_HOLD_BYTES they are
    computed once and held; past it (long rows) each index computes its rows afresh, so the teacher's
    logits over a long row never exist at once (`chunked_position_loss` reads them a chunk at a time)."""

    def __init__(self, teacher: TeacherHead, batch: dict[str, torch.Tensor], need: torch.Tensor):
        self.teacher = teacher
        self.chunk = max(1, TEACHER_HOLD_BYTES // (4 * teacher.lm_head.shape[0]))  # rows of TEACHER_HOLD_BYTES
        self.compact = "teacher_ids" in batch                                     # a compact store's top-k
        self.inputs = ((batch["teacher_ids"][need], batch["teacher_logp"][need]) if self.compact
                       else (batch["last"][need],))
        self.rows = int(need.sum())
        self.held = self.compute(slice(None)) if self.rows <= self.chunk else None
        self.held_probs = None                                                    # probs(): made on first use
        with torch.no_grad():
            self.top = (self.held.argmax(-1) if self.held is not None else
                        torch.cat([self.compute(slice(s, s + self.chunk)).argmax(-1)
                                   for s in range(0, self.rows, self.chunk)]))   # [M]

    @torch.no_grad()
    def compute(self, rows) -> torch.Tensor:
        if self.compact:
            return self.teacher.log_probs_from_top_k(self.inputs[0][rows], self.inputs[1][rows])
        return self.teacher.log_probs(self.inputs[0][rows])                      # fp32

    def __getitem__(self, rows) -> torch.Tensor:
        return self.held[rows] if self.held is not None else self.compute(rows)

    @torch.no_grad()
    def probs(self, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(p [r, N], sum p log p [r], sum p [r]) at `rows`: what ChunkKL reads; held rows keep theirs for
        every step (one exp per batch, where each step would take its own)."""
        if self.held is None:
            logp = self.compute(rows)
            p = logp.exp()
            return p, (p * logp).sum(-1), p.sum(-1)
        if self.held_probs is None:
            p = self.held.exp()
            self.held_probs = (p, (p * self.held).sum(-1), p.sum(-1))
        return tuple(x[rows] for x in self.held_probs)


def teacher_targets(teacher: TeacherHead, batch: dict[str, torch.Tensor]):
    """The teacher at positions t' whose next token is in the document (every step k reads its
    targets from these rows) -> (logp TeacherRows [M, N], argmax [M], flat pos -> row)."""
    need_teacher = in_document(batch["doc_ids"], -1)                              # [B,T]
    rows = TeacherRows(teacher, batch, need_teacher)
    compact_index = need_teacher.flatten().long().cumsum(0) - 1                   # flat pos -> row of teacher_logp
    return rows, rows.top, compact_index


LOSS_CHUNK = 512   # rows of the draft's logits one loss op reads at once: [512, 8192] fp32 stays in cache, where an
                   # 8K row's [8192, 8192] streams through memory for every elementwise op (2x slower loss)


def chunked_position_loss(logits: torch.Tensor, teacher_logp: TeacherRows, t_rows: torch.Tensor,
                          t_top: torch.Tensor, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_loss [R], the draft's argmax [R]) of the draft's logits [R, N] (any dtype; log-softmax in
    fp32) against the teacher's rows `t_rows`, LOSS_CHUNK rows at a time; the default KL computes and
    differentiates each chunk in one pass (`ChunkKL`), the other losses by autograd over each chunk. A long
    row's teacher log-probs are read a chunk at a time: past TEACHER_HOLD_BYTES they never exist at once."""
    n = min(LOSS_CHUNK, teacher_logp.chunk)
    if loss == "kl":
        return ChunkKL.apply(logits, t_rows, teacher_logp, n)
    losses, tops = [], []
    for s in range(0, max(len(t_rows), 1), n):
        logq = torch.log_softmax(logits[s:s + n].float(), dim=-1)
        losses.append(position_loss(logq, teacher_logp[t_rows[s:s + n]], t_top[s:s + n], loss))
        tops.append(logq.detach().argmax(-1))
    return torch.cat(losses), torch.cat(tops)


class ChunkKL(torch.autograd.Function):
    """KL(p || softmax(z)) per row (and argmax z), chunk by chunk, saving only the logits z: with
    logsumexp l, KL = sum p (log p - z) + sum(p) l, and its gradient g (softmax(z) sum(p) - p) is recomputed
    per chunk in backward. Kept by hand (torch has no fused KL-from-logits on the CPU): autograd's
    version keeps [R, N] fp32 intermediates and streams each through memory, 1.5x slower at 8K rows."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, t_rows: torch.Tensor, teacher: TeacherRows, n: int):
        ctx.save_for_backward(logits, t_rows)
        ctx.teacher, ctx.n = teacher, n
        kl = logits.new_empty(len(t_rows), dtype=torch.float32)
        top = torch.empty(len(t_rows), dtype=torch.long, device=logits.device)
        for s in range(0, len(t_rows), n):
            p, p_logp, p_sum = teacher.probs(t_rows[s:s + n])
            z = logits[s:s + n].float()
            kl[s:s + n] = p_logp - (p * z).sum(-1) + p_sum * torch.logsumexp(z, dim=-1)
            top[s:s + n] = z.argmax(-1)
        ctx.mark_non_differentiable(top)
        return kl, top

    @staticmethod
    def backward(ctx, grad_kl: torch.Tensor, _grad_top):
        logits, t_rows = ctx.saved_tensors
        grad, n = torch.empty_like(logits), ctx.n
        for s in range(0, len(t_rows), n):
            p, _, p_sum = ctx.teacher.probs(t_rows[s:s + n])
            q = torch.softmax(logits[s:s + n].float(), dim=-1)
            grad[s:s + n] = q.mul_(p_sum[:, None]).sub_(p).mul_(grad_kl[s:s + n, None])
        return grad, None, None, None


def position_loss(logp: torch.Tensor, t_logp: torch.Tensor, t_top: torch.Tensor, loss: str) -> torch.Tensor:
    """Per-position loss [R] over the draft vocab, teacher p and draft q:
    kl: KL(p || q); ce: -log q(argmax p); tv: total variation 1/2 sum |p - q| = 1 - sum min(p, q),
    one minus the chance that speculative sampling accepts the draft; jsd: Jensen-Shannon."""
    if loss == "kl":
        return (t_logp.exp() * (t_logp - logp)).sum(-1)
    if loss == "tv":
        return 0.5 * (t_logp.exp() - logp.exp()).abs().sum(-1)
    if loss == "jsd":
        log_mid = torch.logaddexp(t_logp, logp) - math.log(2.0)                  # log of (p + q) / 2
        return 0.5 * ((t_logp.exp() * (t_logp - log_mid)).sum(-1) + (logp.exp() * (logp - log_mid)).sum(-1))
    return -logp.gather(1, t_top[:, None]).squeeze(1)


@torch.no_grad()
def add_step_sums(sums: dict, k: int, per_pos: torch.Tensor, correct: torch.Tensor, through: torch.Tensor,
                  rows: torch.Tensor, is_trained: torch.Tensor) -> None:
    """Step k's metric sums; `through` (correct at every step so far) is updated in place."""
    prev = through[rows]
    through[rows] = prev & correct
    sums[f"loss_sum_{k}"] = per_pos.detach().sum().double()
    sums[f"count_{k}"] = torch.tensor(float(per_pos.numel()), dtype=torch.float64)
    sums[f"full_correct_{k}"] = (prev & correct)[is_trained].sum().double()
    sums[f"prev_correct_{k}"] = prev[is_trained].sum().double()
