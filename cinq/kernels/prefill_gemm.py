"""Prefill-sized linears on a weight widened or dequantized a block of output rows at a time (``dequant_linear``):
the int4 / int8 kernels are built for decode-sized batches, so a prompt's rows go faster through a GEMM.

Which GEMM depends on the CPU. Where torch's bf16 GEMM is emulated (AVX2 and below, ``bf16_gemm_is_emulated``) it
runs 5-7x below the float32 one, so the block is widened to float32 and BLAS's float32 GEMM runs it
(``fp32_linear``; issue 26). Where the CPU has bf16 instructions (AVX512-BF16, AMX) the block is rounded to bf16
and oneDNN's bf16 GEMM runs it (``bf16_block_linear``): on the AVX512-BF16 Zen 4, a SmolLM2 layer's Q4_1 linears
at 256-2,048 rows took 2.2-2.3x less time than with the float32 GEMM (1 and 2 threads, the blocks dequantized
natively; benchmarks/results/prefill_gemm_bf16.md).

The widened weight is never kept: a float32 copy would double a dense model's memory (4x an int8 one's). Widening
one block of ``BLOCK_BYTES`` at a time keeps it in cache for its GEMM instead of streaming an N x K float32 copy
through memory: measured on the AVX2 EPYC (1 thread, draft) on the 32,000 x 768 LM head at 32-128 rows, 4.8x /
2.6x faster than widening the whole weight first, and no slower on the 768-4,096-row projections.

Numerics: in ``fp32_linear`` bf16 activations and weights widen to float32 exactly, the sums accumulate in float32
and round once to the output dtype, as the emulated bf16 GEMM does; integer codes dequantize to the same float32
values as the layer's own ``dequantize`` (the callers pass those functions). ``bf16_block_linear`` rounds each
dequantized weight once to bf16 (a relative 2^-9, below the int8 rounding of activations the decode kernels make),
then accumulates in float32 and rounds the output once, as a dense bf16 layer does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cinq.kernels.cpu_native import bf16_gemm_is_emulated

BLOCK_BYTES = 2 << 20  # float32 bytes of weight widened per GEMM: a block stays in the EPYC's L2 + L3 slice
# From this many rows a dense bf16 linear runs the float32 GEMM where bf16 is emulated. Measured on the AVX2 EPYC
# (1 thread, draft, benchmarks/prefill_gemm.py) on the 110M Llama's projections: at 64 rows 0.6-0.95x the time of
# the chunked native bf16 kernel (cpu_native.chunked_small_m_linear), at 32 rows from 0.75x to 1.08x (a tie).
DENSE_MIN_ROWS = 64

WeightRows = Callable[[int, int], torch.Tensor]  # (n0, n1) -> float32 W[n0:n1] [n1 - n0, K]


def block_rows(k: int) -> int:
    """Output rows widened per GEMM for an input width ``k`` (a multiple of 16, at least 16)."""
    return max(16, BLOCK_BYTES // (4 * max(k, 1)) // 16 * 16)


def fp32_linear(x: torch.Tensor, weight_rows: WeightRows, n: int, bias: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W^T (+ bias) in float32, rounded once to ``out_dtype`` (default x's dtype).
    ``weight_rows(n0, n1)`` gives float32 W[n0:n1] (widened or dequantized for this call only)."""
    if x.dim() != 2:
        raise ValueError(f"fp32_linear: x must be [M, K], got {tuple(x.shape)}")
    m, k = x.shape
    out_dtype = x.dtype if out_dtype is None else out_dtype
    xf = x if x.dtype == torch.float32 else x.float()
    y = torch.empty(m, n, dtype=out_dtype, device=x.device)
    step = block_rows(k)
    # a narrower output is rounded block by block from one float32 buffer, never a float32 [M, N] (a prompt's
    # logits over a 49,152-token vocabulary: 200 MB per 1,024 rows)
    acc = y if out_dtype == torch.float32 else torch.empty(m, min(step, n), dtype=torch.float32, device=x.device)
    for n0 in range(0, n, step):
        n1 = min(n, n0 + step)
        # a column slice of a row-major matrix is a valid BLAS output (leading dimension: its row length)
        part = acc[:, n0:n1] if acc is y else acc[:, : n1 - n0]
        torch.mm(xf, weight_rows(n0, n1).t(), out=part)
        if bias is not None:
            part += bias[n0:n1]  # in float32: the output is rounded once, after the bias
        if acc is not y:
            y[:, n0:n1] = part
    return y


def bf16_block_linear(x: torch.Tensor, weight_rows: WeightRows, n: int) -> torch.Tensor:
    """y [M, N] bf16 = x [M, K] (bf16) @ W^T, each block of ``weight_rows`` rounded to bf16 for the bf16 GEMM."""
    if x.dim() != 2 or x.dtype != torch.bfloat16:
        raise ValueError(f"bf16_block_linear: x must be bf16 [M, K], got {x.dtype} {tuple(x.shape)}")
    m, k = x.shape
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    step = block_rows(k)
    for n0 in range(0, n, step):
        n1 = min(n, n0 + step)
        torch.mm(x, weight_rows(n0, n1).to(torch.bfloat16).t(), out=y[:, n0:n1])
    return y


def dequant_linear(x: torch.Tensor, weight_rows: WeightRows, n: int) -> torch.Tensor:
    """y [M, N] bf16 = x [M, K] (bf16) @ W^T for a quantized layer's prefill-sized input: the bf16 GEMM on bf16
    blocks where the CPU has bf16 instructions, else the float32 GEMM (the module docstring says why)."""
    if x.dtype == torch.bfloat16 and x.is_cpu and not bf16_gemm_is_emulated():
        return bf16_block_linear(x, weight_rows, n)
    return fp32_linear(x, weight_rows, n, out_dtype=torch.bfloat16)


def dense_fp32_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``F.linear`` for a dense bf16 CPU linear with at least ``DENSE_MIN_ROWS`` rows (no autograd) where the bf16
    GEMM is emulated, through ``fp32_linear``; None when it does not apply."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if (rows < DENSE_MIN_ROWS or x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 or not x.is_cpu
            or torch.is_grad_enabled() or not bf16_gemm_is_emulated()):
        return None
    y = fp32_linear(x.reshape(rows, k), lambda n0, n1: weight[n0:n1].float(), weight.shape[0], bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], weight.shape[0])
