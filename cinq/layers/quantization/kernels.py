"""Matmul kernels for quantized weights: pick one per layer at load time, then run it every step.

Weight-only (GPTQ / AWQ / RTN files, all unpacked first to a ``QuantizedWeight``):

* ``int4_native`` / ``int8_native``: cinq's grouped-integer kernels (cinq/kernels/cpu/grouped_int_linear.cpp,
  AVX2, built on first use; ``native.py``) for bf16 activations and groups of any multiple of 32 channels (per
  channel too): a decode step streams the codes at close to memory speed. GPTQ/AWQ/RTN zero points become the
  kernel's float32 ``min = -scale * zero`` (int4) or its int8 shift plus min (int8). Past ``NATIVE_MAX_ROWS``
  rows (int8; ``INT4_NATIVE_MAX_ROWS`` for int4: a prefill chunk) the layer dequantizes its packed weight, a
  block of rows at a time, for BLAS's float32 GEMM (``native._grouped_linear``, ``cinq.kernels.prefill_gemm``),
  which is faster there.
* ``int4_cpu``: ``aten._weight_int4pack_mm_for_cpu`` (bf16 activations; 20-60x slower with fp32 ones). Its
  dequantization is ``(q - 8) * scale + zero`` per (group, channel), so a GPTQ/AWQ zero point z maps to
  ``zero = (8 - z) * scale``. Act-order weights are permuted along K so groups become contiguous, and the
  activations are gathered with the same permutation at run time.
* ``int8_cpu``: ``aten._weight_int8pack_mm`` (per-channel scales only): codes shifted to int8 (q - 128); a
  non-128 zero point adds ``sum(x) * scale * (128 - z)`` per channel.
* ``triton``: the CUDA dequant-GEMM of cinq/kernels/triton/int4_gemm.py (any group layout, g_idx included).
* ``dequant``: everything else (shapes the fast kernels refuse, e.g. N not a multiple of 16): codes kept as
  uint8, dequantized then multiplied on each call. Same math; said once in the log per reason.
* ``dequantized_at_load``: 2- and 3-bit weights (no kernel for them exists here): dequantized once, at load, to
  a dense weight in the compute dtype and run like a dense linear (the native skinny bf16 kernel at decode
  sizes). The quantization error is exactly the file's; speed and memory are the dense model's.

W8A8 (SmoothQuant): ``torch._int_mm`` on int8 activations (per-token dynamic or per-tensor static scales).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from cinq.kernels.cpu_native import chunked_small_m_linear, small_m_linear_native
from cinq.kernels.prefill_gemm import dense_fp32_linear
from cinq.layers.quantization.native import NATIVE_MAX_ROWS  # noqa: F401  (the NF4 / FP8 linears' switch too)
from cinq.layers.quantization.native import (
    grouped_module,
    int4_linear,
    int4_module,
    int8_grouped_linear,
    pack_int4,
    pack_int8,
)
from cinq.layers.quantization.packing import pack_along
from cinq.layers.quantization.qweight import KERNEL_BITS, QuantizedWeight

log = logging.getLogger(__name__)
_SAID: set[str] = set()

INT4_CPU_GROUPS = (256, 128, 64, 32)  # group sizes _weight_int4pack_mm_for_cpu accepts
DEQUANTIZED_AT_LOAD = "dequantized_at_load"  # the kind of 2/3-bit layers (see the module docstring)


def int8_module() -> Any | None:
    """The native int8 kernel's module, None when it is unavailable (a seam tests patch, like ``int4_module``)."""
    return grouped_module()


def say_once(message: str) -> None:
    """Log a fallback reason once per process."""
    if message not in _SAID:
        _SAID.add(message)
        log.warning(message)


@dataclass(slots=True)
class Prepared:
    """A layer's kernel choice and the tensors it runs on (registered as buffers by the linear module)."""

    kind: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    arg: int = 0  # the kernel's integer argument: group size (int4_cpu, dequant_grouped) or bits (triton)


def triton_tensors(qw: QuantizedWeight, device: torch.device) -> dict[str, torch.Tensor]:
    """The Triton dequant-GEMM's tensors for ``qw``: GPTQ-packed codes, float32 scales and zeros, g_idx."""
    return {"qweight": pack_along(qw.qweight.t(), qw.bits, dim=0).to(device),
            "scales": qw.scales.float().contiguous().to(device),
            "zeros": qw.zeros.float().contiguous().to(device),
            "g_idx": qw.g_idx.to(torch.int32).contiguous().to(device)}


def _contiguous_group_perm(qw: QuantizedWeight) -> tuple[torch.Tensor | None, int] | None:
    """(permutation of K making every group a contiguous run of equal size, that size), or None.
    The permutation is None when the groups are already in order."""
    k = qw.in_features
    g_idx = qw.g_idx.long()
    counts = torch.bincount(g_idx, minlength=qw.num_groups)
    size = int(counts[0]) if counts.numel() else 0
    if size == 0 or bool((counts != size).any()) or size * qw.num_groups != k:
        return None
    if bool((g_idx[1:] >= g_idx[:-1]).all()):
        return None, size
    return torch.argsort(g_idx, stable=True), size


def _int4_cpu_group(k: int, size: int) -> int | None:
    """A group size the CPU kernel takes that tiles both ``size`` and K (scales are then repeated)."""
    return next((g for g in INT4_CPU_GROUPS if size % g == 0 and k % g == 0), None)


_FORCE_DEQUANTIZED_AT_LOAD = False


@contextmanager
def dequantized_at_load() -> Iterator[None]:
    """Within this block, every weight-only layer loaded is dequantized once, at load, and run like a dense
    linear (the DEQUANTIZED_AT_LOAD kind): the same function at dense speed. For evaluations that only need the
    quantized model's outputs, on CPUs where the int4 / int8 kernels are slow (they are built for decode-sized
    batches: a float32 perplexity window ran ~70x slower through the int8 kernel than dense on SmolLM2-135M)."""
    global _FORCE_DEQUANTIZED_AT_LOAD
    before, _FORCE_DEQUANTIZED_AT_LOAD = _FORCE_DEQUANTIZED_AT_LOAD, True
    try:
        yield
    finally:
        _FORCE_DEQUANTIZED_AT_LOAD = before


def prepare_weight_only(qw: QuantizedWeight, device: torch.device, dtype: torch.dtype, name: str = "") -> Prepared:
    """Choose and build the kernel for ``qw`` on ``device`` computing in ``dtype``."""
    n, k = qw.out_features, qw.in_features
    if _FORCE_DEQUANTIZED_AT_LOAD:
        return Prepared(DEQUANTIZED_AT_LOAD, {"weight": qw.dequantize(dtype).to(device).contiguous()})
    if qw.bits not in KERNEL_BITS:
        say_once(f"{qw.bits}-bit weights: no {qw.bits}-bit kernel, dequantized to {dtype} at load (served at dense "
                 f"{dtype} speed and memory; the accuracy is the {qw.bits}-bit file's)")
        return Prepared(DEQUANTIZED_AT_LOAD, {"weight": qw.dequantize(dtype).to(device).contiguous()})
    if device.type == "cuda":
        try:
            import cinq.kernels.triton.int4_gemm  # noqa: F401  (Triton importable: the kernel can run)
            return Prepared("triton", triton_tensors(qw, device), qw.bits)
        except ImportError as e:
            say_once(f"quantized linear: Triton unavailable ({e}); dequantize-then-matmul on CUDA")
            return _prepare_dequant(qw, device, dtype)
    layout = _contiguous_group_perm(qw)
    if layout is not None and layout[1] % 32 == 0 and dtype == torch.bfloat16:
        perm, size = layout
        if qw.bits == 4 and int4_module() is not None:
            return _native("int4_native", pack_int4(qw, perm, size), perm, size)
        if qw.bits == 8 and int8_module() is not None:
            return _native("int8_native", pack_int8(qw, perm, size), perm, size)
    if qw.bits == 4:
        reason = None
        if n % 16:
            reason = f"out_features {n} not a multiple of 16"
        elif layout is None:
            reason = "groups of unequal size"
        elif _int4_cpu_group(k, layout[1]) is None:
            reason = f"group size {layout[1]} / in_features {k} not tiled by {INT4_CPU_GROUPS}"
        if reason is None:
            return _prepare_int4_cpu(qw, layout[0], _int4_cpu_group(k, layout[1]), layout[1], dtype)
        say_once(f"int4 CPU kernel cannot take {name or 'a layer'} ({reason}): dequantize-then-matmul fallback")
    elif qw.bits == 8:
        reason = None
        if qw.num_groups != 1:
            reason = "grouped int8 (the kernel takes one scale per channel)"
        elif k % 16:
            reason = f"in_features {k} not a multiple of 16"
        if reason is None:
            return _prepare_int8_cpu(qw, dtype)
        say_once(f"int8 CPU kernel cannot take {name or 'a layer'} ({reason}): dequantize-then-matmul fallback")
    return _prepare_dequant(qw, device, dtype)


def _native(kind: str, tensors: dict[str, torch.Tensor], perm: torch.Tensor | None, group: int) -> Prepared:
    if perm is not None:
        tensors["perm"] = perm
    return Prepared(kind, tensors, group)


def _prepare_int4_cpu(qw: QuantizedWeight, perm: torch.Tensor | None, kgroup: int, size: int,
                      dtype: torch.dtype) -> Prepared:
    q = qw.qweight.to(torch.int32)
    g_of_col = qw.g_idx.long()
    if perm is not None:
        q = q[:, perm]
        g_of_col = g_of_col[perm]
    # After the permutation group j covers columns [j*size, (j+1)*size); the kernel sees K/kgroup groups.
    groups = g_of_col[::kgroup]  # source group of each kernel group
    scale = qw.scales.float()[groups]  # [K/kgroup, N]
    zero = (8.0 - qw.zeros.float()[groups]) * scale
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 2)
    tensors = {"packed": packed, "scales_zeros": torch.stack([scale, zero], dim=-1).to(dtype).contiguous()}
    if perm is not None:
        tensors["perm"] = perm
    return Prepared("int4_cpu", tensors, kgroup)


def _prepare_int8_cpu(qw: QuantizedWeight, dtype: torch.dtype) -> Prepared:
    q = (qw.qweight.to(torch.int16) - 128).to(torch.int8).contiguous()
    scale = qw.scales.float()[0]
    tensors = {"weight": q, "scale": scale.to(dtype)}
    zero = qw.zeros[0].float()
    if bool((zero != 128).any()):
        tensors["zero_fix"] = (scale * (128.0 - zero)).to(dtype)
    return Prepared("int8_cpu", tensors)


def _prepare_dequant(qw: QuantizedWeight, device: torch.device, dtype: torch.dtype) -> Prepared:
    codes = qw.qweight.to(torch.uint8).contiguous()
    if qw.has_sequential_groups():  # scales stay per group
        size = qw.group_size if qw.group_size > 0 else qw.in_features
        tensors = {"codes": codes, "scales": qw.scales.to(dtype).contiguous(), "zeros": qw.zeros.to(dtype).contiguous()}
        return Prepared("dequant_grouped", {k: v.to(device) for k, v in tensors.items()}, size)
    # Act-order groups: expand scales and zeros per input channel (2x the codes' bytes in dtype).
    g = qw.g_idx.long()
    tensors = {"codes": codes, "scale_k": qw.scales.float()[g].t().to(dtype).contiguous(),  # [N, K]
               "zero_k": qw.zeros.float()[g].t().to(dtype).contiguous()}
    return Prepared("dequant", {k: v.to(device) for k, v in tensors.items()})


def dequantized_weight(kind: str, t: dict[str, torch.Tensor], group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] of a dequant-kind layer."""
    codes = t["codes"].to(dtype)
    if kind == "dequant":
        return (codes - t["zero_k"]) * t["scale_k"]
    n, k = codes.shape
    full = k // group_size * group_size
    w = torch.empty_like(codes)
    head = codes[:, :full].view(n, -1, group_size)
    w[:, :full] = ((head - t["zeros"][: full // group_size].t().unsqueeze(-1))
                   * t["scales"][: full // group_size].t().unsqueeze(-1)).reshape(n, full)
    if full < k:  # a last, shorter group (GPTQ allows K not a multiple of G)
        w[:, full:] = (codes[:, full:] - t["zeros"][-1].unsqueeze(-1)) * t["scales"][-1].unsqueeze(-1)
    return w


def weight_only_mm(p_kind: str, t: dict[str, torch.Tensor], arg: int, x: torch.Tensor) -> torch.Tensor:
    """y = x W^T for a prepared weight-only layer; x [..., K] -> [..., N] in x's dtype. (Called per linear per
    step: no conversions or copies unless needed.)"""
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.dim() == 2  # the serving forward's [T, K]: no reshapes on the way in or out
    x2 = x if flat else x.reshape(-1, k)
    if p_kind in ("int4_native", "int8_native"):
        perm = t.get("perm")
        if perm is not None:
            x2 = x2.index_select(1, perm)
        # the kernel for decode-sized rows, dequantize + float32 GEMM past them (native._grouped_linear)
        y = int4_linear(x2, t, arg) if p_kind == "int4_native" else int8_grouped_linear(x2, t, arg)
    elif p_kind == "int4_cpu":
        perm = t.get("perm")
        if perm is not None:
            x2 = x2.index_select(1, perm)
        sz = t["scales_zeros"]
        if x2.dtype != sz.dtype:
            x2 = x2.to(sz.dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), t["packed"], arg, sz)
    elif p_kind == "int8_cpu":
        s = t["scale"]
        if x2.dtype != s.dtype:
            x2 = x2.to(s.dtype)
        x2 = x2.contiguous()
        y = torch._weight_int8pack_mm(x2, t["weight"], s)
        fix = t.get("zero_fix")
        if fix is not None:
            y = y + x2.sum(dim=1, keepdim=True) * fix
    elif p_kind == DEQUANTIZED_AT_LOAD:
        w = t["weight"]
        if x2.dtype != w.dtype:
            x2 = x2.to(w.dtype)
        y = None
        if x2.dtype == torch.bfloat16 and x2.device.type == "cpu" and not torch.is_grad_enabled():
            # as DenseLinear does: the skinny kernel for decode-sized rows, float32 GEMM for prefill-sized ones
            y = small_m_linear_native(x2, w, None)
            if y is None:
                y = dense_fp32_linear(x2, w, None)
            if y is None:
                y = chunked_small_m_linear(x2, w, None)
        if y is None:
            y = F.linear(x2, w)
    elif p_kind == "triton":
        from cinq.kernels.triton.int4_gemm import triton_weight_only_mm
        y = triton_weight_only_mm(x2, t, arg)
    else:
        y = F.linear(x2, dequantized_weight(p_kind, t, arg, x2.dtype))
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return y if flat else y.reshape(*lead, -1)


# ---------------------------------------------------------------------------------------------------- W8A8


def quantize_activations(x: torch.Tensor, input_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes of x [M, K] and their scales [M, 1] (per token) or [1, 1] (static per tensor)."""
    xf = x.float()
    if input_scale is None:
        scale = (xf.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-8)
    else:
        scale = input_scale.float().reshape(1, 1)
    return torch.round(xf / scale).clamp(-127, 127).to(torch.int8), scale


def int8_gemm(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """int32 a [M, K] @ b_t [K, N] for int8 operands (exact), with a float path where _int_mm refuses."""
    m, k = a.shape
    n = b_t.shape[1]
    if a.device.type == "cpu" or (m > 16 and k % 8 == 0 and n % 8 == 0):
        return torch._int_mm(a, b_t)
    # Small CUDA batches: float64-free exact path (|sum| < 2^24 for K <= 1024; larger K rounds like fp32).
    return (a.float() @ b_t.float()).round().to(torch.int32)


def w8a8_mm(x: torch.Tensor, w_t: torch.Tensor, w_scale: torch.Tensor, input_scale: torch.Tensor | None
            ) -> torch.Tensor:
    """y = dequant(int8(x) @ W_int8^T) for x [..., K]; w_t is the int8 weight transposed [K, N]."""
    lead, k = x.shape[:-1], x.shape[-1]
    xq, xs = quantize_activations(x.reshape(-1, k), input_scale)
    acc = int8_gemm(xq, w_t)
    y = acc.float() * xs * w_scale.float().unsqueeze(0)
    return y.to(x.dtype).reshape(*lead, -1)
