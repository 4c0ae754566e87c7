"""Distillation losses: the divergences the KD literature uses, each per token, averaged over kept tokens.

Notation: student logits ``s``, teacher logits ``t`` (``[..., V]``); with temperature ``T``,
``q = softmax(s / T)`` (student) and ``p = softmax(t / T)`` (teacher); ``mask`` (``[...]``, bool) selects the
tokens that count (None: all). Every function computes in (at least) float32 and detaches the teacher, so
gradients reach the student only. ``KL(a || b) = sum_v a_v (log a_v - log b_v)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cinq.errors import InvalidParameterError


def _mean(per_token: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return per_token.mean()
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum() / mask.sum().clamp_min(1.0)


def _log_probs(s: torch.Tensor, t: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    if temperature <= 0:
        raise InvalidParameterError(f"temperature must be > 0, got {temperature}", "temperature")
    return (F.log_softmax(_f32(s) / temperature, dim=-1),
            F.log_softmax(_f32(t.detach()) / temperature, dim=-1))


def _f32(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (bf16 logits are upcast; float64 stays, for exact tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """Per-token KL(a || b) from log-probabilities (0 * log 0 taken as 0)."""
    a = log_a.exp()
    return torch.where(a > 0, a * (log_a - log_b), torch.zeros_like(a)).sum(-1)


def _check_unit(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0):
        raise InvalidParameterError(f"{name} must be in [0, 1], got {value}", name)


def cross_entropy(s: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """CE = -log softmax(s)[y], averaged over kept tokens (hard labels ``targets``, the plain LM loss)."""
    per_token = F.cross_entropy(s.float().reshape(-1, s.shape[-1]), targets.reshape(-1), reduction="none")
    return _mean(per_token.view(targets.shape), mask)


def forward_kl(s: torch.Tensor, t: torch.Tensor, temperature: float = 1.0,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """Forward KL (Hinton et al.): T^2 * KL(p || q) = T^2 * sum_v p_v (log p_v - log q_v). Mode-covering."""
    lq, lp = _log_probs(s, t, temperature)
    return temperature ** 2 * _mean(_kl(lp, lq), mask)


def reverse_kl(s: torch.Tensor, t: torch.Tensor, temperature: float = 1.0,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """Reverse KL (MiniLLM): T^2 * KL(q || p) = T^2 * sum_v q_v (log q_v - log p_v). Mode-seeking."""
    lq, lp = _log_probs(s, t, temperature)
    return temperature ** 2 * _mean(_kl(lq, lp), mask)


def generalized_jsd(s: torch.Tensor, t: torch.Tensor, beta: float = 0.5, temperature: float = 1.0,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """Generalized Jensen-Shannon divergence (GKD, Agarwal et al. 2024):
    JSD_beta = T^2 * [beta * KL(p || m) + (1 - beta) * KL(q || m)],  m = beta * p + (1 - beta) * q.

    JSD_beta / beta -> KL(p || q) as beta -> 0 and JSD_beta / (1 - beta) -> KL(q || p) as beta -> 1, so (as in
    GKD) the end points are defined as those limits: beta = 0 is forward KL, beta = 1 is reverse KL."""
    _check_unit("beta", beta)
    if beta == 0.0:
        return forward_kl(s, t, temperature, mask)
    if beta == 1.0:
        return reverse_kl(s, t, temperature, mask)
    lq, lp = _log_probs(s, t, temperature)
    lm = torch.logsumexp(torch.stack([lp + math.log(beta), lq + math.log(1.0 - beta)]), dim=0)
    per_token = beta * _kl(lp, lm) + (1.0 - beta) * _kl(lq, lm)
    return temperature ** 2 * _mean(per_token, mask)


def skew_kl(s: torch.Tensor, t: torch.Tensor, lam: float = 0.1, temperature: float = 1.0,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """Skew KL (DistiLLM, Ko et al. 2024): T^2 * KL(p || lam * p + (1 - lam) * q).
    lam = 0 is forward KL; mixing in the teacher keeps the divergence (and its gradient) bounded."""
    _check_unit("lam", lam)
    lq, lp = _log_probs(s, t, temperature)
    lm = _mix(lp, lq, lam)
    return temperature ** 2 * _mean(_kl(lp, lm), mask)


def skew_reverse_kl(s: torch.Tensor, t: torch.Tensor, lam: float = 0.1, temperature: float = 1.0,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """Skew reverse KL (DistiLLM): T^2 * KL(q || (1 - lam) * p + lam * q). lam = 0 is reverse KL."""
    _check_unit("lam", lam)
    lq, lp = _log_probs(s, t, temperature)
    lm = _mix(lq, lp, lam)
    return temperature ** 2 * _mean(_kl(lq, lm), mask)


def _mix(log_self: torch.Tensor, log_other: torch.Tensor, lam: float) -> torch.Tensor:
    """log(lam * self + (1 - lam) * other), stable at lam in {0, 1}."""
    if lam == 0.0:
        return log_other
    if lam == 1.0:
        return log_self
    return torch.logsumexp(torch.stack([log_self + math.log(lam), log_other + math.log(1.0 - lam)]), dim=0)


def total_variation(s: torch.Tensor, t: torch.Tensor, temperature: float = 1.0,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """Total variation distance: TV = 1/2 * sum_v |p_v - q_v| (in [0, 1]; no T^2 factor)."""
    lq, lp = _log_probs(s, t, temperature)
    return _mean(0.5 * (lp.exp() - lq.exp()).abs().sum(-1), mask)


class HiddenProjection(nn.Module):
    """Maps student hidden states to the teacher's width: a learned linear map per matched layer when the widths
    differ, the identity when they are equal (FitNets-style intermediate-representation distillation)."""

    def __init__(self, student_width: int, teacher_width: int, num_layers: int) -> None:
        super().__init__()
        self.identity = student_width == teacher_width
        self.maps = nn.ModuleList(
            [] if self.identity else [nn.Linear(student_width, teacher_width, bias=False) for _ in range(num_layers)])

    def forward(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return h if self.identity else self.maps[i](h)


def layer_map(student_layers: int, teacher_layers: int, which: str = "final") -> list[tuple[int, int]]:
    """(student, teacher) indices into ``forward_with_hidden_states`` lists (index L = final normed state):
    "final" matches the final states only; "all" matches every student layer output j to teacher layer
    round(j * Lt / Ls) (uniform depth mapping, as in TinyBERT)."""
    if which == "final":
        return [(student_layers, teacher_layers)]
    if which == "all":
        return [(j, round(j * teacher_layers / student_layers)) for j in range(1, student_layers + 1)]
    raise InvalidParameterError(f"hidden layer map must be 'final' or 'all', got {which!r}", "hidden_layers")


def hidden_mse(hs: list[torch.Tensor], ht: list[torch.Tensor], proj: HiddenProjection,
               pairs: list[tuple[int, int]], mask: torch.Tensor | None = None) -> torch.Tensor:
    """Hidden-state MSE: mean over matched layers k of mean_d (W_k h_s - h_t)^2, averaged over kept tokens."""
    losses = [_mean(((proj(k, hs[i].float()) - ht[j].detach().float()) ** 2).mean(-1), mask)
              for k, (i, j) in enumerate(pairs)]
    return torch.stack(losses).mean()


def hidden_cosine(hs: list[torch.Tensor], ht: list[torch.Tensor], proj: HiddenProjection,
                  pairs: list[tuple[int, int]], mask: torch.Tensor | None = None) -> torch.Tensor:
    """Hidden-state cosine loss: mean over matched layers of 1 - cos(W_k h_s, h_t), averaged over kept tokens."""
    losses = [_mean(1.0 - F.cosine_similarity(proj(k, hs[i].float()), ht[j].detach().float(), dim=-1), mask)
              for k, (i, j) in enumerate(pairs)]
    return torch.stack(losses).mean()
