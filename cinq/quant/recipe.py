"""QuantRecipe: how the offline tool makes a quantized checkpoint (calibration-time settings of each method).

None of it is needed to load or serve the result; the settings other tools record in ``quantization_config``
(GPTQ's damp_percent and true_sequential, SmoothQuant's alpha) are written there for provenance by
``recorded``. The storage format itself is cinq.layers.quantization.format.QuantFormat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cinq.option_fields import bounded, check_bounds


@dataclass(slots=True)
class QuantRecipe:
    """Offline quantization settings; validated on construction (errors name the field and its limit)."""

    true_sequential: bool = True  # GPTQ: quantize q/k/v, o, gate/up, down in turn inside a block
    damp_percent: float = bounded(0.01, gt=0.0, lt=1.0)  # GPTQ Hessian dampening, fraction of mean(diag(H))
    lazy_batch_size: int = bounded(128, ge=1)  # GPTQ lazy-batch width: columns updated together before the rest of W
    awq_grid: int = bounded(20, ge=1, le=1000)  # AWQ: alpha in {0, 1/n, ..., (n-1)/n}
    awq_clip: bool = True  # AWQ: search a clipping ratio per group after scaling
    smooth_alpha: float = bounded(0.5, ge=0.0, le=1.0)  # SmoothQuant migration strength

    def __post_init__(self) -> None:
        check_bounds(self)

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
