"""QuantRecipe: how the offline tool makes a quantized checkpoint (calibration-time settings of each method).

None of it is needed to load or serve the result; the settings other tools record in ``quantization_config``
(GPTQ's damp_percent and true_sequential, SmoothQuant's alpha) are written there for provenance by
``recorded``. The storage format itself is cinq.layers.quantization.format.QuantFormat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cinq.errors import InvalidParameterError


@dataclass(slots=True)
class QuantRecipe:
    """Offline quantization settings; validated on construction (errors name the field and its limit)."""

    true_sequential: bool = True  # GPTQ: quantize q/k/v, o, gate/up, down in turn inside a block
    damp_percent: float = 0.01  # GPTQ Hessian dampening, fraction of mean(diag(H))
    lazy_batch_size: int = 128  # GPTQ lazy-batch width: columns updated together before the rest of W
    awq_grid: int = 20  # AWQ: alpha in {0, 1/n, ..., (n-1)/n}
    awq_clip: bool = True  # AWQ: search a clipping ratio per group after scaling
    smooth_alpha: float = 0.5  # SmoothQuant migration strength

    def __post_init__(self) -> None:
        if not (0.0 < self.damp_percent < 1.0):
            raise InvalidParameterError(f"damp_percent must be in (0, 1), got {self.damp_percent}", "damp_percent")
        if not isinstance(self.lazy_batch_size, int) or self.lazy_batch_size < 1:
            raise InvalidParameterError(f"lazy_batch_size must be a positive integer, got {self.lazy_batch_size}",
                                        "lazy_batch_size")
        if not isinstance(self.awq_grid, int) or not (1 <= self.awq_grid <= 1000):
            raise InvalidParameterError(f"awq_grid must be an integer in [1, 1000], got {self.awq_grid}", "awq_grid")
        if not (0.0 <= self.smooth_alpha <= 1.0):
            raise InvalidParameterError(f"smooth_alpha must be in [0, 1], got {self.smooth_alpha}", "smooth_alpha")

    def recorded(self, fmt: str) -> dict[str, Any]:
        """The settings files of format ``fmt`` record in their ``quantization_config`` (GPTQ: as AutoGPTQ)."""
        if fmt in ("gptq", "gptq_v2"):
            return {"true_sequential": self.true_sequential, "damp_percent": self.damp_percent}
        if fmt == "w8a8":
            return {"smoothquant_alpha": self.smooth_alpha}
        return {}

    @classmethod
    def from_recorded(cls, qc: dict[str, Any]) -> QuantRecipe:
        """The recorded settings of a ``quantization_config`` (defaults for what it does not say)."""
        return cls(true_sequential=bool(qc.get("true_sequential", True)),
                   damp_percent=float(qc.get("damp_percent", 0.01)),
                   smooth_alpha=float(qc.get("smoothquant_alpha", 0.5)))
