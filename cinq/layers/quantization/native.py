"""The native CPU int4 linear (cinq/kernels/cpu/int4_linear.cpp), built and cached like the other native kernels
by ``cinq.kernels.cpu_native``; optional — when it cannot be built, quantized linears use PyTorch's int4 kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from cinq.kernels.cpu_native import call_native, native_module
from cinq.layers.quantization.qweight import QuantizedWeight


def int4_module() -> Any | None:
    """The compiled extension, building it on first call; None when disabled or unbuildable."""
    return native_module("int4_linear")


def pack_int4(qw: QuantizedWeight, perm: torch.Tensor | None, group: int) -> dict[str, torch.Tensor]:
    """Kernel tensors for ``qw`` (4-bit) whose groups, after the optional input permutation ``perm``, are the
    contiguous runs of ``group`` channels (a multiple of 128): packed [N, K/2] uint8 (see the .cpp for the
    layout), scales [N, K/group] and scale * (zero + 128) [K/group, N], float32."""
    q = qw.qweight.to(torch.int32)
    g_of_col = qw.g_idx.long()
    if perm is not None:
        q = q[:, perm]
        g_of_col = g_of_col[perm]
    n, k = q.shape
    nib = q.reshape(n, k // 128, 4, 32)  # [row, chunk, nibble p, lane j] = channel 32p + j of the chunk
    lanes = nib[:, :, 0] | (nib[:, :, 1] << 4) | (nib[:, :, 2] << 8) | (nib[:, :, 3] << 12)  # [n, chunks, 32]
    lo, hi = (lanes & 0xFF).to(torch.uint8), (lanes >> 8).to(torch.uint8)
    packed = torch.stack([lo, hi], dim=-1).reshape(n, k // 2).contiguous()  # little-endian uint16 lanes
    groups = g_of_col[::group]  # source group of each kernel group
    scales = qw.scales.float()[groups]
    sz128 = scales * (qw.zeros.float()[groups] + 128.0)
    return {"packed": packed, "scales": scales.t().contiguous(), "sz128": sz128.contiguous()}


def int4_linear(x: torch.Tensor, t: dict[str, torch.Tensor], group: int) -> torch.Tensor:
    """y [M, N] bf16 = x [M, K] @ dequant(W)^T with the tensors of ``pack_int4``."""
    module = int4_module()
    assert module is not None, "int4_linear called without the native module"
    if x.dtype != torch.bfloat16:
        x = x.to(torch.bfloat16)
    return call_native(module, "int4_linear", x.contiguous(), t["packed"], t["scales"], t["sz128"], group)
