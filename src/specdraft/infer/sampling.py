"""Token choice for speculative generation: greedy, or sampling with temperature / top-p, and the
speculative rejection rule that keeps the target's distribution exactly.

Rule (Leviathan et al. 2023, Chen et al. 2023): a drafted token x drawn from q is accepted with
probability min(1, p(x)/q(x)); on rejection the replacement is drawn from norm(max(p - q, 0)); when
every draft is accepted the bonus token is drawn from p. Both p and q are after the same
temperature/top-p processing, and q lives in the target's vocabulary (zero outside the draft vocab).
A deterministic proposer (n-gram, or greedy drafting) is q = one-hot(x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.errors import SpecdraftError


@dataclass
class Sampling:
    """temperature 0 = greedy (argmax, lossless against plain greedy decoding)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise SpecdraftError(f"--temperature {self.temperature}: must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecdraftError(f"--top-p {self.top_p}: must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, device) -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed(0 if self.seed is None else self.seed)
        return g


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] after temperature and top-p (nucleus) filtering.

    Top-p keeps the smallest set of most likely tokens whose mass reaches top_p (the token that
    crosses the threshold is kept), as transformers' TopPLogitsWarper does.
    """
    probs = torch.softmax(logits.float() / max(sampling.temperature, 1e-8), dim=-1)
    if sampling.top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs      # mass of strictly likelier tokens
    sorted_probs = sorted_probs.masked_fill(mass_before >= sampling.top_p, 0.0)
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_draft(p: torch.Tensor, q: torch.Tensor | None, token: int,
                 generator: torch.Generator) -> tuple[bool, int | None]:
    """One step of the rejection rule. p, q: [V] target-vocab probabilities (q None = one-hot at
    `token`). Returns (accepted, replacement token when rejected)."""
    p_x = float(p[token])
    q_x = 1.0 if q is None else float(q[token])
    u = float(torch.rand((), generator=generator, device=p.device))
    if q_x > 0 and u * q_x < p_x:          # u < p/q without dividing
        return True, None
    residual = p.clone()
    if q is None:
        residual[token] = 0.0
    else:
        residual = (residual - q).clamp_min_(0.0)
    total = float(residual.sum())
    if total <= 0.0:                        # p <= q everywhere: only possible when p == q
        return False, sample(p, generator)
    return False, sample(residual / total, generator)
