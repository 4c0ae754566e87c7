"""Triton dequant-GEMM for GPTQ-layout weights (4 or 8 bits): y = x (q - z) s, the CUDA path of quantized
linears.

The weight stays packed in memory as GPTQ stores it (int32 [K * bits / 32, N], consecutive input channels in
one word, lowest bits first); each program unpacks a [BLOCK_K, BLOCK_N] tile in registers, looks up the
scale and zero of each input channel's group through ``g_idx`` (so act-order checkpoints need no repacking),
and accumulates x_tile @ w_tile in float32. Zero points are kept unpacked as floats ([groups, N], small).
AWQ weights are repacked into this layout at load time by the quantization runtime
(cinq/layers/quantization/kernels.py), which owns the file formats: this module only sees plain tensors.

Decode is memory bound: reading 4-bit weights instead of 16-bit ones is where the speed comes from; the
unpack arithmetic hides under the loads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cinq.kernels.triton import interpreter_enabled

INTERPRETED = interpreter_enabled()


@triton.jit
def _wq_gemm_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, g_ptr, y_ptr, M, N, K,
                    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_ym, stride_yn,
                    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    FP32_DOT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    per_word: tl.constexpr = 32 // BITS
    mask_bits: tl.constexpr = (1 << BITS) - 1
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
        words = tl.load(qw_ptr + (offs_k // per_word)[:, None].to(tl.int64) * stride_qk + offs_n[None, :] * stride_qn,
                        mask=kn_mask, other=0)
        shift = (offs_k % per_word) * BITS
        q = (words >> shift[:, None]) & mask_bits  # arithmetic shift; the mask drops the sign bits
        g = tl.load(g_ptr + offs_k, mask=k_mask, other=0)
        s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn, mask=kn_mask, other=0.0)
        z = tl.load(z_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn, mask=kn_mask, other=0.0)
        w = (q.to(tl.float32) - z) * s
        if FP32_DOT:  # the interpreter (and fp32 models) multiply in float32
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")  # compiled fp32 dots are TF32 otherwise
        else:
            acc += tl.dot(x, w.to(x.dtype))
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :] * stride_yn, y,
             mask=m_mask[:, None] & n_mask[None, :])


def triton_weight_only_mm(x: torch.Tensor, t: dict[str, torch.Tensor], bits: int) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(W)^T. ``t`` holds ``qweight`` int32 [K * bits / 32, N] (GPTQ packing along
    K, lowest bits first), ``scales`` and ``zeros`` float32 [groups, N], ``g_idx`` int32 [K], all on x's device."""
    m, k = x.shape
    qweight, scales = t["qweight"], t["scales"]
    n = qweight.shape[1]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_n, block_k = 64, 32
    fp32_dot = INTERPRETED or x.dtype == torch.float32
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _wq_gemm_kernel[grid](x, qweight, scales, t["zeros"], t["g_idx"], y, m, n, k,
                          x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1),
                          scales.stride(0), scales.stride(1), y.stride(0), y.stride(1),
                          BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, FP32_DOT=fp32_dot)
    return y
