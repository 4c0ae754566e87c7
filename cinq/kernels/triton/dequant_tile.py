"""The tile loop the Triton dequant-GEMMs share (GPTQ / AWQ in ``int4_gemm``, NF4 in ``nf4_gemm``): each program
owns a [BLOCK_M, BLOCK_N] tile of y = x W^T, walks K in BLOCK_K steps, multiplies the activation tile by the
weight tile its kernel dequantized in registers, and accumulates in float32. Only the weight tile differs between
formats; the activation load, the dot and the store are here, once, with the launch shape."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def output_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's rows and columns of y, their in-bounds masks, and the zeroed float32 accumulator."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_m, offs_n, offs_m < M, offs_n < N, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)


@triton.jit
def k_tile(x_ptr, k0, offs_m, m_mask, n_mask, K, stride_xm, stride_xk, BLOCK_K: tl.constexpr):
    """The K step from ``k0``: its input channels and their mask, the [BLOCK_K, BLOCK_N] weight-tile mask, and
    the [BLOCK_M, BLOCK_K] activation tile (zeros outside x)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    k_mask = offs_k < K
    x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :] * stride_xk,
                mask=m_mask[:, None] & k_mask[None, :], other=0.0)
    return offs_k, k_mask, k_mask[:, None] & n_mask[None, :], x


@triton.jit
def accumulate(acc, x, w, FP32_DOT: tl.constexpr):
    """acc + x @ w, w being a float32 dequantized tile. ``FP32_DOT``: multiply in float32 (fp32 models; the
    interpreter, whose bf16 dot is wrong), as IEEE products (compiled fp32 dots are TF32 otherwise)."""
    if FP32_DOT:
        acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
    else:
        acc += tl.dot(x, w.to(x.dtype))
    return acc


@triton.jit
def store_y_tile(y_ptr, acc, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_yn):
    """Write the accumulated tile in y's dtype."""
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :] * stride_yn,
             acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@dataclass(slots=True, frozen=True)
class TileLaunch:
    """The launch of a dequant-GEMM over x [M, K] and N output columns: tile sizes, grid, and the dot's dtype."""

    block_m: int
    block_n: int
    block_k: int
    fp32_dot: bool
    grid: tuple[int, int]


def tile_launch(x: torch.Tensor, n: int, interpreted: bool) -> TileLaunch:
    """Row tiles sized to M (decode's few rows waste no tile), 64-column x 32-deep weight tiles."""
    m = x.shape[0]
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_n, block_k = 64, 32
    return TileLaunch(block_m, block_n, block_k, interpreted or x.dtype == torch.float32,
                      (triton.cdiv(m, block_m), triton.cdiv(n, block_n)))
