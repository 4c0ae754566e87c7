"""FP8 (float8_e4m3fn) weights and activations: the arithmetic of vLLM's ``fp8`` method and compressed-tensors'
float-quantized scheme, and the choice of its CUDA kernel.

Weights: ``W ~= e4m3(W / s) * s`` with ``s = max|W| / 448`` per tensor or per output channel (448: e4m3's largest
finite value). Activations, when quantized: ``x ~= e4m3(x / a) * a`` with ``a = max|x| / 448`` per token
(dynamic) or a calibrated per-tensor ``input_scale`` (static; values beyond it clip). A step then computes
``(e4m3(x) @ e4m3(W)^T) * a * s``: on a GPU with FP8 tensor cores (compute capability 8.9+: Ada, Hopper) one
``torch._scaled_mm``; elsewhere the same product with the e4m3 values widened (they are exact in bf16 and float32).
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
_TINY = 1e-12  # a zero row / tensor keeps a positive scale (its codes are all zero)
SCALED_MM_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0) and later


def fp8_quantize(w: torch.Tensor, strategy: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn [N, K], scale float32: [1] per tensor, [N] per channel) of W [N, K]."""
    wf = w.float()
    amax = wf.abs().amax(dim=1) if strategy == "channel" else wf.abs().amax().reshape(1)
    scale = (amax / E4M3_MAX).clamp(min=_TINY)
    q = (wf / (scale.unsqueeze(1) if strategy == "channel" else scale)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """W [N, K] float32: codes times the per-channel ([N]) or per-tensor ([1]) scale."""
    s = scale.float().reshape(-1)
    return q.float() * (s.unsqueeze(1) if s.numel() > 1 else s)


def quantize_input(x: torch.Tensor, input_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes of x [M, K], their scales float32 [M, 1]): per token (``input_scale`` None) or the static
    per-tensor scale."""
    xf = x.float()
    if input_scale is None:
        s = (xf.abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp(min=_TINY)
    else:
        s = input_scale.float().reshape(1, 1).expand(xf.shape[0], 1)
    return (xf / s).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), s.contiguous()


def input_scale_of(amax: float) -> float:
    """The static per-tensor ``input_scale`` for activations whose calibrated max |x| is ``amax``."""
    return max(float(amax) / E4M3_MAX, _TINY)


def cuda_kind(capability: tuple[int, int], n: int, k: int, act_scheme: str, has_scaled_mm: bool = True) -> str:
    """The CUDA kernel of an FP8 layer: ``fp8_scaled_mm`` (FP8 tensor cores: capability >= 8.9, N and K multiples
    of 16, activations quantized) or ``fp8_dequant`` (weights widened per call; weight-only FP8, older GPUs)."""
    if act_scheme == "none" or not has_scaled_mm or tuple(capability) < SCALED_MM_CAPABILITY or n % 16 or k % 16:
        return "fp8_dequant"
    return "fp8_scaled_mm"


def scaled_mm(xq: torch.Tensor, xs: torch.Tensor, codes: torch.Tensor, scale_row: torch.Tensor,
              out_dtype: torch.dtype) -> torch.Tensor:
    """(xq [M, K] @ codes [N, K]^T) * xs [M, 1] * scale_row [1, N] by ``torch._scaled_mm`` (row-wise scales; the
    weight's column-major [K, N] view is its transpose, no copy)."""
    return torch._scaled_mm(xq, codes.t(), scale_a=xs, scale_b=scale_row, out_dtype=out_dtype)
