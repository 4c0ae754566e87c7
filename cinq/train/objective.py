"""A distillation objective: any weighted sum of the losses in ``cinq.train.losses``.

Spec strings name terms and weights: ``"fkl"``, ``"fkl=0.9,ce=0.1"``, ``"gjsd=1,hidden_mse=0.5"``. Term names:

=============  ==============================================
``ce``         cross-entropy on the data's next tokens
``fkl``        forward KL (x T^2)
``rkl``        reverse KL (x T^2)
``gjsd``       generalized JSD with ``beta`` (x T^2)
``skl``        skew KL with ``lam`` (x T^2)
``srkl``       skew reverse KL with ``lam`` (x T^2)
``tv``         total variation
``hidden_mse`` hidden-state MSE through a learned projection
``hidden_cos`` hidden-state cosine through a learned projection
=============  ==============================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cinq.errors import InvalidParameterError
from cinq.train import losses as L

LOSS_NAMES = ("ce", "fkl", "rkl", "gjsd", "skl", "srkl", "tv", "hidden_mse", "hidden_cos")
_HIDDEN = ("hidden_mse", "hidden_cos")


@dataclass(slots=True)
class Objective:
    """Weighted loss terms and their parameters."""

    weights: dict[str, float]
    temperature: float = 1.0
    beta: float = 0.5
    lam: float = 0.1
    hidden_layers: str = "final"
    pairs: list[tuple[int, int]] = field(default_factory=list)  # set by the trainer from the two depths

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(LOSS_NAMES))
        if unknown or not self.weights:
            raise InvalidParameterError(f"loss: unknown or missing term(s) {unknown}; known: {list(LOSS_NAMES)}",
                                        "loss")
        if any(w < 0 for w in self.weights.values()):
            raise InvalidParameterError(f"loss: weights must be >= 0, got {self.weights}", "loss")
        if self.temperature <= 0:
            raise InvalidParameterError(f"temperature must be > 0, got {self.temperature}", "temperature")
        for name in ("beta", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise InvalidParameterError(f"{name} must be in [0, 1], got {getattr(self, name)}", name)

    @classmethod
    def parse(cls, spec: str, **params: object) -> Objective:
        """``"fkl=0.9,ce=0.1"`` (a bare name has weight 1) plus temperature/beta/lam/hidden_layers."""
        weights: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, w = part.partition("=")
            try:
                weights[name.strip()] = float(w) if w else 1.0
            except ValueError:
                raise InvalidParameterError(f"loss: weight of {name!r} must be a number, got {w!r}",
                                            "loss") from None
        return cls(weights, **params)  # type: ignore[arg-type]

    @property
    def needs_teacher_logits(self) -> bool:
        return any(n not in ("ce", *_HIDDEN) for n in self.weights)

    @property
    def needs_hidden(self) -> bool:
        return any(n in _HIDDEN for n in self.weights)

    def __call__(self, s_logits: torch.Tensor, t_logits: torch.Tensor | None, targets: torch.Tensor,
                 mask: torch.Tensor | None = None, hs: list[torch.Tensor] | None = None,
                 ht: list[torch.Tensor] | None = None, proj: L.HiddenProjection | None = None
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        """Total weighted loss and each term's value."""
        T = self.temperature
        terms: dict[str, torch.Tensor] = {}
        for name in self.weights:
            if name == "ce":
                terms[name] = L.cross_entropy(s_logits, targets, mask)
            elif name in _HIDDEN:
                if hs is None or ht is None or proj is None:
                    raise InvalidParameterError(f"loss term {name} needs hidden states and a projection", "loss")
                fn = L.hidden_mse if name == "hidden_mse" else L.hidden_cosine
                terms[name] = fn(hs, ht, proj, self.pairs, mask)
            else:
                if t_logits is None:
                    raise InvalidParameterError(f"loss term {name} needs teacher logits", "loss")
                terms[name] = {
                    "fkl": lambda: L.forward_kl(s_logits, t_logits, T, mask),
                    "rkl": lambda: L.reverse_kl(s_logits, t_logits, T, mask),
                    "gjsd": lambda: L.generalized_jsd(s_logits, t_logits, self.beta, T, mask),
                    "skl": lambda: L.skew_kl(s_logits, t_logits, self.lam, T, mask),
                    "srkl": lambda: L.skew_reverse_kl(s_logits, t_logits, self.lam, T, mask),
                    "tv": lambda: L.total_variation(s_logits, t_logits, T, mask),
                }[name]()
        total = sum(self.weights[n] * v for n, v in terms.items())
        return total, {n: float(v.detach()) for n, v in terms.items()}
