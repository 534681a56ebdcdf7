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
from specdraft.train.config import MAX_TTT_STEPS  # noqa: F401  (the objectives and probe check it here)

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


TEACHER_CHUNK = 4096   # teacher rows whose log-probs over the draft vocab are held at once: a row with more
                       # (long context) has them computed chunk by chunk where a step's loss reads them


class TeacherRows:
    """The teacher's log-probs over the draft vocab at the positions t' whose next token is in the
    document, indexed like a tensor [M, N] (`teacher_logp[rows]`). Up to TEACHER_CHUNK rows they are
    computed once and held; past it (long rows) each index computes its rows afresh, so the teacher's
    logits over a long row never exist at once (`chunked_position_loss` reads them a chunk at a time)."""

    def __init__(self, teacher: TeacherHead, batch: dict[str, torch.Tensor], need: torch.Tensor):
        self.teacher = teacher
        self.compact = "teacher_ids" in batch                                     # a compact store's top-k
        self.inputs = ((batch["teacher_ids"][need], batch["teacher_logp"][need]) if self.compact
                       else (batch["last"][need],))
        self.rows = int(need.sum())
        self.held = self.compute(slice(None)) if self.rows <= TEACHER_CHUNK else None
        with torch.no_grad():
            self.top = (self.held.argmax(-1) if self.held is not None else
                        torch.cat([self.compute(slice(s, s + TEACHER_CHUNK)).argmax(-1)
                                   for s in range(0, self.rows, TEACHER_CHUNK)]))   # [M]

    @torch.no_grad()
    def compute(self, rows) -> torch.Tensor:
        if self.compact:
            return self.teacher.log_probs_from_top_k(self.inputs[0][rows], self.inputs[1][rows])
        return self.teacher.log_probs(self.inputs[0][rows])                      # fp32

    def __getitem__(self, rows) -> torch.Tensor:
        return self.held[rows] if self.held is not None else self.compute(rows)


def teacher_targets(teacher: TeacherHead, batch: dict[str, torch.Tensor]):
    """The teacher at positions t' whose next token is in the document (every step k reads its
    targets from these rows) -> (logp TeacherRows [M, N], argmax [M], flat pos -> row)."""
    need_teacher = in_document(batch["doc_ids"], -1)                              # [B,T]
    rows = TeacherRows(teacher, batch, need_teacher)
    compact_index = need_teacher.flatten().long().cumsum(0) - 1                   # flat pos -> row of teacher_logp
    return rows, rows.top, compact_index


def chunked_position_loss(logp: torch.Tensor, teacher_logp: TeacherRows, t_rows: torch.Tensor,
                          t_top: torch.Tensor, loss: str) -> torch.Tensor:
    """position_loss [R] over rows of at most TEACHER_CHUNK at a time: the teacher's log-probs of a long
    row exist one chunk at a time (one chunk, the same computation, for rows up to TEACHER_CHUNK)."""
    return torch.cat([position_loss(logp[s:s + TEACHER_CHUNK], teacher_logp[t_rows[s:s + TEACHER_CHUNK]],
                                    t_top[s:s + TEACHER_CHUNK], loss)
                      for s in range(0, max(len(t_rows), 1), TEACHER_CHUNK)])


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
