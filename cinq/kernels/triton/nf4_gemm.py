"""Triton dequant-GEMM for bitsandbytes NF4 weights, the CUDA path of ``NF4Linear``: y = x (level[q] * absmax)^T.

The weight stays as bitsandbytes stores it (uint8 [N, K / 2], two 4-bit indices per byte, the first value in the
high nibble); each program reads a [BLOCK_K, BLOCK_N] tile of indices (each byte loaded for its two channels),
looks the 16 NF4 levels up, scales them by their block's absmax (float32 [N * K / blocksize], blocks running along
each row) and accumulates x_tile @ w_tile in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cinq.kernels.triton import interpreter_enabled
from cinq.kernels.triton.dequant_tile import accumulate, k_tile, output_tile, store_y_tile, tile_launch

INTERPRETED = interpreter_enabled()


@triton.jit
def _nf4_gemm_kernel(x_ptr, q_ptr, a_ptr, lv_ptr, y_ptr, M, N, K, stride_xm, stride_xk, stride_ym, stride_yn,
                     BLOCKSIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     FP32_DOT: tl.constexpr):
    offs_m, offs_n, m_mask, n_mask, acc = output_tile(M, N, BLOCK_M, BLOCK_N)
    for k0 in range(0, K, BLOCK_K):
        offs_k, _, kn_mask, x = k_tile(x_ptr, k0, offs_m, m_mask, n_mask, K, stride_xm, stride_xk, BLOCK_K)
        flat = offs_n[None, :].to(tl.int64) * K + offs_k[:, None]  # flattened index of W[n, k]: [BLOCK_K, BLOCK_N]
        byte = tl.load(q_ptr + flat // 2, mask=kn_mask, other=0).to(tl.int32)
        idx = tl.where(flat % 2 == 0, byte >> 4, byte & 15)
        level = tl.load(lv_ptr + idx, mask=kn_mask, other=0.0)
        absmax = tl.load(a_ptr + flat // BLOCKSIZE, mask=kn_mask, other=0.0)
        acc = accumulate(acc, x, level * absmax, FP32_DOT)
    store_y_tile(y_ptr, acc, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_yn)


def nf4_gemm(x: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, levels: torch.Tensor,
             blocksize: int) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W^T, W[n, k] = levels[q(n, k)] * absmax[(n K + k) / blocksize]; ``codes`` uint8
    [N, K / 2] (bitsandbytes' order), ``absmax`` float32, ``levels`` float32 [16], all on x's device."""
    m, k = x.shape
    n = codes.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tiles = tile_launch(x, n, INTERPRETED)
    _nf4_gemm_kernel[tiles.grid](x, codes, absmax, levels, y, m, n, k, x.stride(0), x.stride(1), y.stride(0),
                                 y.stride(1), BLOCKSIZE=blocksize, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                                 BLOCK_K=tiles.block_k, FP32_DOT=tiles.fp32_dot)
    return y
