"""DSpark's training forward: DFlash's blocks at sampled anchors (model/dflash/objective.py), with the
Markov bias in every slot's logits (teacher forcing: slot k+1 reads token a+k of the data) and the
confidence head trained by a binary cross-entropy against whether the slot's draft (its argmax)
matches the teacher's argmax, on the trained slots. The head reads the block's output detached, so
its loss trains the head only and the drafter's loss is DFlash's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdraft.model.dflash.objective import DFlashObjective, dflash_forward


def confidence_loss(drafter, k: int, out, out_rows, prev_ids, correct, is_trained, sums) -> torch.Tensor | None:
    """BCE of the confidence head at slot k+1 over its trained rows; adds conf_loss_sum_k / conf_count_k."""
    if drafter.confidence_head is None:
        return None
    normed = drafter.norm(out.detach()).flatten(0, 1)[out_rows][is_trained]              # [R', H]
    embed = drafter.markov_embed(prev_ids[is_trained]).detach()                          # [R', r]
    logit = drafter.confidence_logit(normed, embed)                                       # [R']
    per_pos = F.binary_cross_entropy_with_logits(logit, correct[is_trained].float(), reduction="none")
    sums[f"conf_loss_sum_{k}"] = per_pos.detach().sum().double()
    sums[f"conf_count_{k}"] = torch.tensor(float(per_pos.numel()), dtype=torch.float64)
    return per_pos.sum() / max(per_pos.numel(), 1)


class DSparkObjective(DFlashObjective):
    def forward(self, batch: dict[str, torch.Tensor]):
        generator = None if self.training else torch.Generator().manual_seed(0)

        def on_slot(k, out, out_rows, prev_ids, correct, is_trained, sums):
            return confidence_loss(self.drafter, k, out, out_rows, prev_ids, correct, is_trained, sums)
        return dflash_forward(self.drafter, self.teacher, batch, self.slots, self.step_decay, self.loss,
                              self.aux_noise if self.training else 0.0, generator, on_slot)
