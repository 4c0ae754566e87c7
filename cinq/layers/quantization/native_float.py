"""cinq's native float-code linears (cinq/kernels/cpu/float_code_linear.cpp): NF4 and FP8 (e4m3) weights decoded
to float32 in registers, bf16 activations. Built and cached like the other native kernels
(``cinq.kernels.cpu_native``); optional: without them (no compiler, no AVX2 + FMA + F16C) ``float_kernels_available()``
is False and the layers use their dequantized-weight path."""

from __future__ import annotations

from typing import Any

import torch

from cinq.kernels.cpu_native import call_native, native_module

_MODULE = "float_code_linear"
_NONE = torch.empty(0, dtype=torch.float32, device="cpu")


def float_module() -> Any | None:
    """The compiled extension (built on first call); None when disabled, unbuildable or without a fast path."""
    return native_module(_MODULE)


def float_kernels_available() -> bool:
    return float_module() is not None


def _bf16_rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
    return x2 if x2.is_contiguous() else x2.contiguous()


def nf4_linear(x: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, levels: torch.Tensor,
               blocksize: int) -> torch.Tensor:
    """y [M, N] bf16 = x [M, K] @ W^T, W[n, k] = levels[q] * absmax[(n K + k) / blocksize]; ``codes`` uint8
    [N, K / 2] in bitsandbytes' order (first value in the high nibble)."""
    return call_native(float_module(), "nf4_linear", _bf16_rows(x), codes, absmax, levels, blocksize)


def fp8_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor,
               row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] bf16 = (x [M, K] @ (e4m3(codes) * scale[n])^T) * row_scale[m]; ``codes`` uint8 [N, K] (the
    float8_e4m3fn bits), ``scale`` float32 [N], ``row_scale`` float32 [M] or None."""
    rs = _NONE if row_scale is None else row_scale.float().reshape(-1).contiguous()
    return call_native(float_module(), "fp8_linear", _bf16_rows(x), codes, scale, rs)
