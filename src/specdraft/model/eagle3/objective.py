"""EAGLE-3's training forward: the training-time-test (TTT) unroll.

Alignment (docs/DESIGN.md): at position t the drafter sees aux(t) and token t+1 and predicts token
t+2. Unrolled step k>0 feeds the drafter's own hidden_out of step k-1 and token t+k+1 at position
t+k, and predicts token t+k+2. The teacher for that prediction is the target's distribution at
position t+k+1, softmax(lm_head(final_norm(last[t+k+1]))) restricted to the draft vocab rows and
renormalised. A prediction is trained iff token t+k+2 is in the same document and loss-masked.

Efficiency: the teacher's log-probs are computed once per batch, only over draft rows and only at
positions whose next token is trained; the drafter's lm_head runs only on the rows trained at each
step (the hidden states of all rows still flow into the next step's attention). No [T, V_target]
tensor is ever built.

Metric sums are plain 0-dim float64 tensors (numerators and denominators), so batches and ranks
add them up (`add_sums`, or an all_reduce) and `finalize_metrics` turns them into rates.
"""

from __future__ import annotations

import torch
from torch import nn

from specdraft.model.eagle3.module import DynamicCache, Eagle3Drafter, TTTBlocks, ttt_block_mask
from specdraft.train.config import MAX_TTT_STEPS
from specdraft.train.objective import (ATTENTION, LOSSES, TTT_INPUTS, TeacherHead, add_step_sums, in_document,
                                       chunked_position_loss, shift_left, teacher_targets, valid_positions)


def ttt_forward(drafter: Eagle3Drafter, teacher: TeacherHead, batch: dict[str, torch.Tensor], steps: int = 3,
                step_decay: float = 1.0, loss: str = "kl", aux_noise: float = 0.0, attention: str = "sdpa",
                inputs: str = "data", parallel: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Unroll `steps` draft steps over a packed batch -> (loss, metric sums).

    parallel=True is P-EAGLE (model/peagle): every step k>0 is a mask slot, the mask token with
    fc(mask_hidden) instead of the next token with the step before's output, so the K drafts of a
    serving round come from one forward; the attention pattern (and so this unroll) is TTT's.

    loss = sum_k step_decay**k * mean over trained positions of `position_loss` (KL(teacher || draft)
    by default). inputs="draft" feeds step k>0 the drafter's own step k-1 prediction (argmax, as a
    chain drafts at serving time) instead of the data's token. As in speculators, a position is correct "through k" when it
    matched the teacher at every step 0..k, trained or not (a draft that misses a prompt token is
    rejected at serving time just the same); the rates count loss-masked positions only.
    attention="flex" builds flex-attention BlockMasks (same semantics) instead of boolean masks.
    """
    check_ttt_settings(steps, loss, attention, inputs)
    make_mask = ttt_block_mask if attention == "flex" else TTTBlocks                # ttt_mask by query blocks
    window = int(getattr(drafter.config, "sliding_window", 0) or 0)               # 0: the whole context
    input_ids, doc_ids, loss_mask = batch["input_ids"], batch["doc_ids"], batch["loss_mask"]
    position_ids = batch["position_ids"]
    B, T = input_ids.shape
    teacher_logp, teacher_top, compact_index = teacher_targets(teacher, batch)

    aux = batch["aux"].to(drafter.fc.weight.dtype)                                # [B,T,n_aux,H]
    if aux_noise > 0 and drafter.training:
        aux = aux + (torch.rand_like(aux) * 2 - 1) * aux_noise
    hidden = drafter.combine_aux(aux)                                             # [B,T,H]

    cache = DynamicCache()
    total = hidden.new_zeros((), dtype=torch.float32)
    sums = {}
    through = torch.ones(B * T, dtype=torch.bool, device=input_ids.device)        # correct at every step so far
    drafted = None                                                                # [B*T] step k-1's predictions
    for k in range(steps):
        tokens = (shift_left(input_ids, k + 1, 0) if drafted is None                # token t+k+1 at position t
                  else drafted.view(B, T))                                        # ... or as step k-1 drafted it
        if parallel and k > 0:                                                    # a P-EAGLE mask slot
            tokens = torch.full_like(input_ids, drafter.config.mask_token_id)
            hidden = drafter.combine_aux(drafter.mask_hidden).expand(B, T, -1)   # [B,T,H]
        mask = make_mask(doc_ids, k, window)                                      # ttt_mask's [B,1,T,(k+1)T]
        out = drafter.decode(tokens, hidden, position_ids + k, mask, cache)       # [B,T,H] pre-norm

        defined = in_document(doc_ids, k).flatten()                               # [B*T] has a teacher
        trained = valid_positions(doc_ids, loss_mask, k).flatten()                # [B*T] loss-masked too
        rows = defined.nonzero().squeeze(1)                                       # [R]
        is_trained = trained[rows]                                                # [R]
        logits = drafter.compute_logits(out, rows)                                # [R, N]
        t_rows = compact_index[rows + k + 1]                                      # teacher at t+k+1
        t_top = teacher_top[t_rows]                                               # [R]
        per_pos, top = chunked_position_loss(logits, teacher_logp, t_rows, t_top, loss)
        per_pos = per_pos[is_trained]
        total = total + (step_decay ** k) * per_pos.sum() / max(per_pos.numel(), 1)
        add_step_sums(sums, k, per_pos, top == t_top, through, rows, is_trained)
        hidden = drafter.feedback(out)
        if inputs == "draft" and k + 1 < steps:                                   # token t+k+2 as drafted
            drafted = shift_left(input_ids, k + 2, 0).flatten()
            drafted[rows] = drafter.draft_to_target(top)
    return total, sums


def check_ttt_settings(steps: int, loss: str, attention: str, inputs: str = "data") -> None:
    if not 1 <= steps <= MAX_TTT_STEPS:
        raise ValueError(f"ttt steps must be in 1..{MAX_TTT_STEPS}, got {steps}")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    if inputs not in TTT_INPUTS:
        raise ValueError(f"ttt inputs must be one of {TTT_INPUTS}, got {inputs!r}")


class TTTObjective(nn.Module):
    """drafter + teacher + TTT settings behind one forward(batch) -> (loss, sums), so that DDP or
    FSDP can wrap the whole training computation as one module call."""

    def __init__(self, drafter: Eagle3Drafter, teacher: TeacherHead, steps: int = 3, step_decay: float = 1.0,
                 loss: str = "kl", aux_noise: float = 0.0, attention: str = "sdpa", inputs: str = "data",
                 parallel: bool = False):
        super().__init__()
        self.drafter, self.teacher = drafter, teacher
        self.steps, self.step_decay, self.loss, self.aux_noise = steps, step_decay, loss, aux_noise
        self.attention, self.inputs, self.parallel = attention, inputs, parallel

    def forward(self, batch: dict[str, torch.Tensor]):
        return ttt_forward(self.drafter, self.teacher, batch, self.steps, self.step_decay, self.loss,
                           self.aux_noise if self.training else 0.0, self.attention, self.inputs, self.parallel)
