"""The integer grid of the weight-only methods: scale and zero point of a group from its values or its range,
and codes on that grid (RTN, GPTQ and AWQ all quantize through these).

Symmetric grids use the fixed zero 2^(bits-1) and s = 2 max|w| / (2^bits - 1) (GPTQ's choice, so files match
what AutoGPTQ writes); asymmetric grids stretch [min(w, 0), max(w, 0)] over the full range.
"""

from __future__ import annotations

import torch


def grid_params(w: torch.Tensor, bits: int, sym: bool, min_zero: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and integer zero for each row of ``w`` [N, k] (one group's columns). Returns ([N], [N]).

    ``min_zero`` = 1 keeps asymmetric zeros representable in GPTQ v1 files (which store zero - 1)."""
    w = w.float()
    return grid_from_range(w.amin(dim=1), w.amax(dim=1), bits, sym, min_zero)


def grid_from_range(lo: torch.Tensor, hi: torch.Tensor, bits: int, sym: bool, min_zero: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and integer zero covering [lo, hi] per row (0 always inside the range)."""
    maxq = (1 << bits) - 1
    lo = lo.float().clamp(max=0)
    hi = hi.float().clamp(min=0)
    if sym:
        scale = 2 * torch.maximum(-lo, hi) / maxq
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return scale, torch.full(scale.shape, 1 << (bits - 1), dtype=torch.int32)
    scale = (hi - lo) / maxq
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-lo / scale).clamp(min_zero, maxq)
    return scale, zero.to(torch.int32)


def quantize_with(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes of ``w`` [N, k] on the grid (scale, zero) given per row ([N]); int32 in [0, 2^bits)."""
    maxq = (1 << bits) - 1
    q = torch.round(w.float() / scale.unsqueeze(1)) + zero.unsqueeze(1).float()
    return q.clamp(0, maxq).to(torch.int32)


def dequantize_with(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Float values of codes ``q`` [N, k] on the per-row grid (scale, zero)."""
    return scale.unsqueeze(1) * (q.float() - zero.unsqueeze(1).float())
