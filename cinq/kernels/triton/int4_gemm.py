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
from cinq.kernels.triton.dequant_tile import accumulate, k_tile, output_tile, store_y_tile, tile_launch

INTERPRETED = interpreter_enabled()


@triton.jit
def _wq_gemm_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, g_ptr, y_ptr, M, N, K,
                    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_ym, stride_yn,
                    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    FP32_DOT: tl.constexpr):
    per_word: tl.constexpr = 32 // BITS
    mask_bits: tl.constexpr = (1 << BITS) - 1
    offs_m, offs_n, m_mask, n_mask, acc = output_tile(M, N, BLOCK_M, BLOCK_N)
    for k0 in range(0, K, BLOCK_K):
        offs_k, k_mask, kn_mask, x = k_tile(x_ptr, k0, offs_m, m_mask, n_mask, K, stride_xm, stride_xk, BLOCK_K)
        words = tl.load(qw_ptr + (offs_k // per_word)[:, None].to(tl.int64) * stride_qk + offs_n[None, :] * stride_qn,
                        mask=kn_mask, other=0)
        shift = (offs_k % per_word) * BITS
        q = (words >> shift[:, None]) & mask_bits  # arithmetic shift; the mask drops the sign bits
        g = tl.load(g_ptr + offs_k, mask=k_mask, other=0)
        s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn, mask=kn_mask, other=0.0)
        z = tl.load(z_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn, mask=kn_mask, other=0.0)
        acc = accumulate(acc, x, (q.to(tl.float32) - z) * s, FP32_DOT)
    store_y_tile(y_ptr, acc, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_yn)


def triton_weight_only_mm(x: torch.Tensor, t: dict[str, torch.Tensor], bits: int) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(W)^T. ``t`` holds ``qweight`` int32 [K * bits / 32, N] (GPTQ packing along
    K, lowest bits first), ``scales`` and ``zeros`` float32 [groups, N], ``g_idx`` int32 [K], all on x's device."""
    m, k = x.shape
    qweight, scales = t["qweight"], t["scales"]
    n = qweight.shape[1]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tiles = tile_launch(x, n, INTERPRETED)
    _wq_gemm_kernel[tiles.grid](x, qweight, scales, t["zeros"], t["g_idx"], y, m, n, k,
                                x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1),
                                scales.stride(0), scales.stride(1), y.stride(0), y.stride(1), BITS=bits,
                                BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                                FP32_DOT=tiles.fp32_dot)
    return y
