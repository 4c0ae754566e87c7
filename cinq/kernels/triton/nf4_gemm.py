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

INTERPRETED = interpreter_enabled()


@triton.jit
def _nf4_gemm_kernel(x_ptr, q_ptr, a_ptr, lv_ptr, y_ptr, M, N, K, stride_xm, stride_xk, stride_ym, stride_yn,
                     BLOCKSIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     FP32_DOT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        kn_mask = k_mask[:, None] & n_mask[None, :]
        flat = offs_n[None, :].to(tl.int64) * K + offs_k[:, None]  # flattened index of W[n, k]: [BLOCK_K, BLOCK_N]
        byte = tl.load(q_ptr + flat // 2, mask=kn_mask, other=0).to(tl.int32)
        idx = tl.where(flat % 2 == 0, byte >> 4, byte & 15)
        level = tl.load(lv_ptr + idx, mask=kn_mask, other=0.0)
        absmax = tl.load(a_ptr + flat // BLOCKSIZE, mask=kn_mask, other=0.0)
        w = level * absmax
        if FP32_DOT:  # the interpreter (and fp32 models) multiply in float32
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype))
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :] * stride_yn, y,
             mask=m_mask[:, None] & n_mask[None, :])


def nf4_gemm(x: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, levels: torch.Tensor,
             blocksize: int) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W^T, W[n, k] = levels[q(n, k)] * absmax[(n K + k) / blocksize]; ``codes`` uint8
    [N, K / 2] (bitsandbytes' order), ``absmax`` float32, ``levels`` float32 [16], all on x's device."""
    m, k = x.shape
    n = codes.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_n, block_k = 64, 32
    fp32_dot = INTERPRETED or x.dtype == torch.float32
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _nf4_gemm_kernel[grid](x, codes, absmax, levels, y, m, n, k, x.stride(0), x.stride(1), y.stride(0),
                           y.stride(1), BLOCKSIZE=blocksize, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                           FP32_DOT=fp32_dot)
    return y
