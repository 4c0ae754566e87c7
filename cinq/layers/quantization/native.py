"""cinq's native grouped-integer linears (cinq/kernels/cpu/grouped_int_linear.cpp), built and cached like the other
native kernels by ``cinq.kernels.cpu_native``; optional — when they cannot be built (or the CPU has no AVX2 + FMA),
``affine_kernels_available()`` is False and quantized linears use PyTorch's kernels.

Two weight forms, each with float32 scales per (output row, group of ``group`` input channels, a multiple of 32):

* int4 affine: ``W[n, k] = scale[n, g] * q[n, k] + min[n, g]``, q in 0..15. GGUF Q4_1 is this form (group 32),
  GGUF Q4_0 is ``min = -8 * scale``, GPTQ / AWQ is ``min = -scale * zero``.
* int8 grouped: ``W[n, k] = scale[n, g] * q[n, k]``, q in -128..127 (GGUF Q8_0: group 32; per channel: group K).

With ``CINQ_INT8_ACTIVATIONS=1`` (the default; ``int8_activations``) the linears below quantize the activations to
int8 and run cinq/kernels/cpu/int8_activation_linear.cpp on the same tensors for group 32, and int4 of any group where
that kernel has AVX512-VNNI (``uses_int8_activations``); with 0, or other groups, int16 activations here
(at group 64 the AVX2 int8 kernel measured 0.91x the int16 one, benchmarks/results/decode_kernels_int8_activations.md).
The kernels keep the scales and mins in float32; ``dequantize_int4_affine`` / ``dequantize_int8_grouped`` give the
W they compute with, from the packed tensors, in float32 (``scale * q + min``, one rounding each).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cinq.kernels.cpu_native import bf16_gemm_is_emulated, call_native, native_module
from cinq.kernels.prefill_gemm import WeightRows, dequant_linear
from cinq.layers.quantization.int8_activations import (int4_affine_linear_i8, int8_grouped_linear_i8,
                                                        uses_int8_activations)
from cinq.layers.quantization.qweight import QuantizedWeight

_MODULE = "grouped_int_linear"
# int8 without a min term: one shared empty tensor, nothing per call
_NO_MINS = torch.empty(0, dtype=torch.float32, device="cpu")
# Rows up to which the bf16-activation kernels run; past them (a prefill chunk, a wide decode batch) the weight is
# dequantized a block of rows at a time for a GEMM (``prefill_gemm.dequant_linear``). Measured on the AVX2 EPYC
# (1 thread, draft, benchmarks/prefill_gemm.py) on the 110M Llama's and SmolLM2's projections against the float32
# GEMM: the int8 kernel and the float32 GEMM are even at 16 rows (the kernel ahead at 8, the GEMM 1.3x ahead at
# 24); the int4 kernel, whose dequantization costs more, is ahead at 24 rows (1.1-2x), even or ahead at 32, even
# (SmolLM2) to 1.65x behind (110M) at 64.
NATIVE_MAX_ROWS = 16
INT4_NATIVE_MAX_ROWS = 32
# The int8-activation kernels (group 32) stay ahead longer. Where the bf16 GEMM is emulated the float32 GEMM wins
# from 512 rows (measured for GGUF Q4_0 on SmolLM2's shapes at 2048 rows: 1.3x less CPU time, and more exact: no
# activation rounding). With bf16 instructions the bf16 GEMM wins from 256 (AVX512-BF16 Zen 4, a SmolLM2 layer's
# Q4_1 linears dequantized by torch's ops: 1.2-1.3x the kernel at 256 rows, even at 128;
# benchmarks/results/prefill_gemm_bf16.md, its "bf16 torch" column).
I8_DEQUANT_ROWS = 512 if bf16_gemm_is_emulated() else 256


def grouped_module() -> Any | None:
    """The compiled extension, building it on first call; None when disabled, unbuildable or without a fast path."""
    return native_module(_MODULE)


def affine_kernels_available() -> bool:
    """True when the native int4-affine / int8-grouped kernels run here (built, with their AVX2 path)."""
    return grouped_module() is not None


def _check_groups(n: int, k: int, group: int, scales: torch.Tensor, what: str) -> None:
    if group < 32 or group % 32 or k % group:
        raise ValueError(f"{what}: group {group} must be a multiple of 32 dividing K = {k}")
    if tuple(scales.shape) != (n, k // group):
        raise ValueError(f"{what}: scales {tuple(scales.shape)} must be [N, K // group] = [{n}, {k // group}]")


def pack_int4_affine(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group: int
                     ) -> dict[str, torch.Tensor]:
    """The kernel's tensors for ``W = scale * q + min``: ``codes`` uint8 [N, K] in 0..15, ``scales`` / ``mins``
    float32 [N, K // group]. Returns ``codes`` uint8 [N, K / 2] (per 32 channels, 16 bytes: byte i holds channel i
    in its low nibble and 16 + i in its high one, GGUF's Q4 order), ``scales`` and ``mins`` float32 [N, K / group]
    (kept bit for bit) and ``q_offset`` (int32 scalar: 8 when min = -8 * scale throughout, else 0; see
    ``dequantize_int4_affine``)."""
    n, k = codes.shape
    _check_groups(n, k, group, scales, "pack_int4_affine")
    if tuple(mins.shape) != tuple(scales.shape):
        raise ValueError(f"pack_int4_affine: mins {tuple(mins.shape)} must match scales {tuple(scales.shape)}")
    q = codes.to(torch.uint8).reshape(n, k // 32, 2, 16)
    if bool((q > 15).any()):
        raise ValueError("pack_int4_affine: codes must be in 0..15")
    packed = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
    scales, mins = scales.to(torch.float32).contiguous(), mins.to(torch.float32).contiguous()
    # min = -8 * scale everywhere (GGUF Q4_0, a symmetric 4-bit GPTQ grid) is W = scale * (q - 8): noted, so that
    # dequantize_int4_affine rounds once, as scale * (q - 8) does, not twice (the kernel is exact either way: its
    # codes times activations are integer sums, scale and min apply to them apart)
    offset = 8 if bool(torch.equal(mins, -8.0 * scales)) else 0
    return {"codes": packed, "scales": scales, "mins": mins, "q_offset": torch.tensor(offset, dtype=torch.int32)}


def unpack_int4_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] of ``pack_int4_affine``'s packed [N, K / 2]."""
    n = packed.shape[0]
    b = packed.reshape(n, -1, 16)
    return torch.stack([b & 15, b >> 4], dim=2).reshape(n, -1)


def int4_codes_float(packed: torch.Tensor) -> torch.Tensor:
    """float32 codes [N, K] of ``pack_int4_affine``'s packed [N, K / 2], written straight into one float32 buffer
    (the stacked uint8 codes and their float copy were two more passes and allocations per prefill call)."""
    n = packed.shape[0]
    b = packed.reshape(n, -1, 1, 16)
    q = torch.empty(n, b.shape[1], 2, 16, dtype=torch.float32, device=packed.device)
    q[:, :, :1].copy_(b & 15)
    q[:, :, 1:].copy_(b >> 4)
    return q.view(n, -1)


_ROW_TENSORS = ("codes", "scales", "mins")  # the kernel tensors with one row per output channel


def rows_of(t: dict[str, torch.Tensor], n0: int, n1: int) -> dict[str, torch.Tensor]:
    """The kernel tensors of output rows [n0, n1): codes, scales and mins sliced, the rest (q_offset) as is."""
    return {key: (v[n0:n1] if key in _ROW_TENSORS else v) for key, v in t.items()}


def dequantize_int4_affine(t: dict[str, torch.Tensor], group: int) -> torch.Tensor:
    """W [N, K] float32 that the kernel computes with: ``scale[n, g] * q[n, k] + min[n, g]`` in float32, one
    multiply then one add; where ``pack_int4_affine`` found min = -8 * scale throughout, ``scale * (q - 8)``
    (GGUF Q4_0's own formula, one rounding). In place on one buffer: the same float32 operations, in the same
    order, as the out-of-place formula."""
    o = int(t["q_offset"]) if "q_offset" in t else 0
    q = int4_codes_float(t["codes"])
    n, k = q.shape
    w = q.view(n, k // group, group)
    s = t["scales"].unsqueeze(-1)
    if o:
        w.sub_(o).mul_(s).add_((t["mins"] + o * t["scales"]).unsqueeze(-1))  # that add: + 0
    else:
        w.mul_(s).add_(t["mins"].unsqueeze(-1))
    return q


def pack_int8_grouped(codes: torch.Tensor, scales: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    """The kernel's tensors for ``W = scale * q``: ``codes`` int8 [N, K], ``scales`` float32 [N, K // group]
    (``group == K``: one scale per output channel)."""
    n, k = codes.shape
    _check_groups(n, k, group, scales, "pack_int8_grouped")
    return {"codes": codes.to(torch.int8).contiguous(), "scales": scales.to(torch.float32).contiguous()}


def dequantize_int8_grouped(t: dict[str, torch.Tensor], group: int) -> torch.Tensor:
    """W [N, K] float32 that the kernel computes with: ``scale[n, g] * q[n, k]`` in float32 (``+ min[n, g]``
    when ``t`` has mins, as ``pack_int8`` makes for an asymmetric 8-bit grid); in place on one buffer."""
    q = t["codes"].float()
    n, k = q.shape
    w = q.view(n, k // group, group).mul_(t["scales"].unsqueeze(-1))
    if "mins" in t:
        w.add_(t["mins"].unsqueeze(-1))
    return q


def _flat_bf16(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != torch.bfloat16:
        x2 = x2.to(torch.bfloat16)
    return x2 if x2.is_contiguous() else x2.contiguous()


def int4_affine_linear(x: torch.Tensor, t: dict[str, torch.Tensor], group: int) -> torch.Tensor:
    """y [..., N] bf16 = x [..., K] @ W^T with ``pack_int4_affine``'s tensors (past the kernel's rows, or without
    the native module: dequantize, then a float32 matmul)."""
    return _grouped_linear(x, t, group, "int4_affine_linear", t["mins"], dequantize_int4_affine,
                           int4_affine_linear_i8, INT4_NATIVE_MAX_ROWS, 4)


def int8_grouped_linear(x: torch.Tensor, t: dict[str, torch.Tensor], group: int) -> torch.Tensor:
    """y [..., N] bf16 = x [..., K] @ W^T with ``pack_int8_grouped``'s tensors (past the kernel's rows, or without
    the native module: dequantize, then a float32 matmul)."""
    return _grouped_linear(x, t, group, "int8_grouped_linear", t.get("mins", _NO_MINS), dequantize_int8_grouped,
                           int8_grouped_linear_i8, NATIVE_MAX_ROWS, 8)


def dequant_module() -> Any | None:
    """The native integer-block dequantization to bf16 (cinq/kernels/cpu/block_dequant.cpp), or None."""
    return native_module("block_dequant")


def bf16_weight_rows(t: dict[str, torch.Tensor], group: int, bits: int) -> WeightRows | None:
    """``(n0, n1) -> W[n0:n1]`` in bf16 from the native one-pass dequantization of the kernel tensors ``t`` (this
    module's, or GGUF's int8-activation ones: fp16 scales, Q4_0 without mins), for the bf16 GEMM of prompt-sized
    inputs: the same bits as the Python dequantization's float32 values rounded. None where the bf16 GEMM is
    emulated (the float32 GEMM takes the exact values) or without the native module."""
    mod = None if bf16_gemm_is_emulated() else dequant_module()
    if mod is None:
        return None
    codes, scales, mins = t["codes"], t["scales"], t.get("mins", _NO_MINS)

    def part(m: torch.Tensor, n0: int, n1: int) -> torch.Tensor:
        return m[n0:n1] if m.numel() else m

    if bits == 4:
        offset = int(t["q_offset"]) if "q_offset" in t else 0
        return lambda n0, n1: mod.dequantize_int4_bf16(codes[n0:n1], scales[n0:n1], part(mins, n0, n1), group,
                                                       offset)
    return lambda n0, n1: mod.dequantize_int8_bf16(codes[n0:n1], scales[n0:n1], part(mins, n0, n1), group)


def _grouped_linear(x: torch.Tensor, t: dict[str, torch.Tensor], group: int, kernel: str, mins: torch.Tensor,
                    dequantize: Callable[[dict[str, torch.Tensor], int], torch.Tensor],
                    linear_i8: Callable[[torch.Tensor, dict[str, torch.Tensor], int], torch.Tensor],
                    max_rows: int, bits: int) -> torch.Tensor:
    """One grouped-int linear: the native ``kernel`` (up to ``max_rows`` rows), its int8-activation variant (up to
    I8_DEQUANT_ROWS - 1), or dequantize + a GEMM (more rows, or no native module)."""
    x2 = _flat_bf16(x)
    mod = grouped_module()
    i8 = uses_int8_activations(group, bits)  # which: the module docstring
    if mod is None or x2.shape[0] > (I8_DEQUANT_ROWS - 1 if i8 else max_rows):
        rows = bf16_weight_rows(t, group, bits) or (lambda n0, n1: dequantize(rows_of(t, n0, n1), group))
        y = dequant_linear(x2, rows, t["codes"].shape[0])
    elif i8:
        y = linear_i8(x2, t, group)
    else:
        y = call_native(mod, kernel, x2, t["codes"], t["scales"], mins, group)
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])


# ------------------------------------------------------------------------- GPTQ / AWQ / RTN weights (QuantizedWeight)


def int4_module() -> Any | None:
    """The native module the int4 GPTQ / AWQ path runs on (kept for callers of the earlier int4-only kernel)."""
    return grouped_module()


def _kernel_groups(qw: QuantizedWeight, perm: torch.Tensor | None, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [N, K] after the optional input permutation, source group of each kernel group)."""
    q = qw.qweight
    g_of_col = qw.g_idx.long()
    if perm is not None:
        q = q[:, perm]
        g_of_col = g_of_col[perm]
    return q, g_of_col[::group]


def pack_int4(qw: QuantizedWeight, perm: torch.Tensor | None, group: int) -> dict[str, torch.Tensor]:
    """``pack_int4_affine`` tensors for a 4-bit ``qw`` whose groups, after the optional input permutation ``perm``,
    are the contiguous runs of ``group`` channels: ``W = s * (q - z) = s * q + (-s * z)``."""
    q, groups = _kernel_groups(qw, perm, group)
    scales = qw.scales.float()[groups].t()  # [N, K / group]
    mins = -scales * qw.zeros.float()[groups].t()
    return pack_int4_affine(q, scales, mins, group)


def int4_linear(x: torch.Tensor, t: dict[str, torch.Tensor], group: int) -> torch.Tensor:
    """y [M, N] bf16 = x [M, K] @ dequant(W)^T with the tensors of ``pack_int4``."""
    return int4_affine_linear(x, t, group)


def pack_int8(qw: QuantizedWeight, perm: torch.Tensor | None, group: int) -> dict[str, torch.Tensor]:
    """``pack_int8_grouped`` tensors for an 8-bit ``qw`` (unsigned codes with zero points): ``s * (q - z)`` is
    ``s * (q - 128) + s * (128 - z)``: codes shift to int8, and a zero point other than 128 adds ``mins`` (absent
    when every zero point is 128, the symmetric grid)."""
    q, groups = _kernel_groups(qw, perm, group)
    scales = qw.scales.float()[groups].t()
    t = pack_int8_grouped((q.to(torch.int16) - 128).to(torch.int8), scales, group)
    zeros = qw.zeros.float()[groups].t()
    if bool((zeros != 128).any()):
        t["mins"] = (scales * (128.0 - zeros)).contiguous()
    return t
