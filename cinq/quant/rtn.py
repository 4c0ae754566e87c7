"""Round-to-nearest (RTN) weight-only quantization: each group's grid from its own min/max, no calibration.

The baseline every other method is measured against, and the quantizer inside GPTQ/AWQ (which choose better
inputs to it: error-compensated columns, activation-aware scales, clipped ranges).
"""

from __future__ import annotations

import math

import torch

from cinq.layers.quantization.qweight import QuantizedWeight, check_grid, default_g_idx
from cinq.quant.grid import grid_from_range, grid_params, quantize_with


def rtn_quantize(w: torch.Tensor, bits: int = 4, group_size: int = 128, sym: bool = True, min_zero: int = 0,
                 clip_ratio: torch.Tensor | None = None) -> QuantizedWeight:
    """Quantize w [N, K] per (group of ``group_size`` input channels, output channel); -1 = per channel.

    ``clip_ratio`` [num_groups, N] (AWQ's clip search) shrinks each group's range before the grid is set."""
    check_grid(bits, group_size)
    n, k = w.shape
    g = k if group_size <= 0 else group_size
    num_groups = math.ceil(k / g)
    wf = w.float()
    if k % g == 0:  # all groups whole: one vectorized pass over [num_groups * N, g]
        rows = wf.reshape(n, num_groups, g).transpose(0, 1).reshape(-1, g)
        lo, hi = torch.aminmax(rows, dim=1)
        if clip_ratio is not None:
            r = clip_ratio.float().reshape(-1)
            lo, hi = lo * r, hi * r
        scale, zero = grid_from_range(lo, hi, bits, sym, min_zero)
        q = quantize_with(rows, scale, zero, bits).reshape(num_groups, n, g).transpose(0, 1).reshape(n, k)
        return QuantizedWeight(q.to(torch.uint8), scale.reshape(num_groups, n), zero.reshape(num_groups, n),
                               default_g_idx(k, group_size), bits, group_size)
    q = torch.empty(n, k, dtype=torch.uint8)
    scales = torch.empty(num_groups, n)
    zeros = torch.empty(num_groups, n, dtype=torch.int32)
    for j in range(num_groups):
        cols = wf[:, j * g:(j + 1) * g]
        if clip_ratio is not None:
            r = clip_ratio[j].float()
            scale, zero = grid_from_range(cols.amin(dim=1) * r, cols.amax(dim=1) * r, bits, sym, min_zero)
        else:
            scale, zero = grid_params(cols, bits, sym, min_zero)
        q[:, j * g:(j + 1) * g] = quantize_with(cols, scale, zero, bits).to(torch.uint8)
        scales[j], zeros[j] = scale, zero
    return QuantizedWeight(q, scales, zeros, default_g_idx(k, group_size), bits, group_size)


def fake_quantize(w: torch.Tensor, bits: int = 4, group_size: int = 128, sym: bool = True,
                  min_zero: int = 0) -> torch.Tensor:
    """w after an RTN round trip (same shape and dtype): what the model computes with once quantized.
    (The inner loop of AWQ's search: written with in-place ops.)"""
    n, k = w.shape
    g = k if group_size <= 0 else group_size
    if k % g:
        return rtn_quantize(w, bits, group_size, sym, min_zero).dequantize(w.dtype)
    maxq = (1 << bits) - 1
    rows = w.float().reshape(-1, g)
    lo, hi = torch.aminmax(rows, dim=1, keepdim=True)
    scale, zero = grid_from_range(lo, hi, bits, sym, min_zero)
    zero = zero.float()
    q = torch.div(rows, scale).round_().add_(zero).clamp_(0, maxq)
    return q.sub_(zero).mul_(scale).reshape(n, k).to(w.dtype)
