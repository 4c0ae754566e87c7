"""Grouped-integer linears with the activations quantized to int8 (cinq/kernels/cpu/int8_activation_linear.cpp):
each activation row in blocks of 32 channels, ``x ~ xs * xq`` with ``xs = max |x| / 127`` (llama.cpp's Q8_0 of the
activations), then int8 x int4 / int8 x int8 dot products (AVX2 ``vpmaddubsw``). Faster than the int16-activation
kernels of ``native`` (the 4-bit codes need no widening), at a numeric cost: an activation's rounding grows from
2^-16 to 2^-8 of its block's largest value (``benchmarks/results/int8_activations.md`` has the cost on the real
model: KL and perplexity against bf16).

The choice is one process-wide knob, ``CINQ_INT8_ACTIVATIONS`` (``1``: int8, ``0``: int16; default ``1``), read
once; ``set_int8_activations`` changes it (evaluations comparing both, tests). GGUF layers decide when they load
(their kernel tensors differ: GGUF's own fp16 scales here), GPTQ / AWQ / RTN layers on every call.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from cinq.kernels.cpu_native import call_native, native_module

ENV = "CINQ_INT8_ACTIVATIONS"
_MODULE = "int8_activation_linear"
_NO_MINS = torch.empty(0, dtype=torch.float32, device="cpu")
_NO_MINS_HALF = torch.empty(0, dtype=torch.float16, device="cpu")
_enabled: bool | None = None


def int8_activations() -> bool:
    """True when the quantized linears quantize their activations to int8 (the knob, and the kernel built here)."""
    global _enabled
    if _enabled is None:
        value = os.environ.get(ENV, "1").strip()
        if value not in ("0", "1"):
            from cinq.errors import InvalidParameterError
            raise InvalidParameterError(f"{ENV}={value!r}: must be 0 (int16 activations) or 1 (int8)", ENV)
        _enabled = value == "1"
    return _enabled and i8_module() is not None


def uses_int8_activations(group: int, bits: int) -> bool:
    """Whether a grouped linear of ``bits``-bit codes and ``group`` input channels per scale (a multiple of 32; per
    channel: K) runs the int8-activation kernel: with the knob on, group 32 everywhere (GGUF's blocks), and 4-bit codes
    of any group where the kernel has AVX512-VNNI. There the 4-bit kernel measured faster at every group (SmolLM2's
    decode shapes: g64 1.42-1.49x the int16 kernel, benchmarks/results/decode_kernels.md; the ~110M random Llama's
    GPTQ g128 decode 107 -> 168 tok/s on 1 thread, 185 -> 205 on 2, ad hoc), while 8-bit codes per channel were no
    faster in a decode step (1.03x on 1 thread, 0.83x on 2, ad hoc) and stay on int16; on AVX2 group 64 measured
    0.91x (decode_kernels_int8_activations.md)."""
    if not int8_activations():
        return False
    return group == 32 or (bits == 4 and group % 32 == 0 and _has_vnni())


@functools.cache
def _has_vnni() -> bool:
    """Whether the built kernel has AVX512-VNNI (asked once: every linear call of the Python layers reads it)."""
    mod = i8_module()
    return mod is not None and bool(mod.has_vnni())


def set_int8_activations(enabled: bool | None) -> None:
    """Override the knob for this process (None: read ``CINQ_INT8_ACTIVATIONS`` again). GGUF layers loaded before
    keep their choice."""
    global _enabled
    _enabled = enabled


def i8_module() -> Any | None:
    """The compiled extension, or None (disabled, unbuildable, no AVX2 + FMA)."""
    return native_module(_MODULE)


def int4_affine_linear_i8(x2: torch.Tensor, t: dict[str, torch.Tensor], group: int, q_offset: int = 0
                          ) -> torch.Tensor:
    """y [M, N] bf16 for x2 bf16 [M, K] contiguous and int4 tensors ``t``: ``codes`` as ``native.pack_int4_affine``,
    ``scales`` float32 or float16 and ``mins`` of the same dtype (absent: none), W = scale * (q - q_offset) + min.
    ``native.pack_int4_affine``'s tensors write Q4_0's offset out as mins: q_offset 0 there; GGUF Q4_0's tensors
    (``gguf_kernel_tensors``) have no mins and q_offset 8. (The offset is an argument, not read from ``t``: a
    tensor's int() costs a microsecond, and this runs for every linear of a step.)"""
    mins = t.get("mins")
    if mins is None:
        mins = _NO_MINS_HALF if t["scales"].dtype == torch.float16 else _NO_MINS
    return call_native(i8_module(), "int4_affine_linear_i8", x2, t["codes"], t["scales"], mins, group, q_offset)


def int8_grouped_linear_i8(x2: torch.Tensor, t: dict[str, torch.Tensor], group: int) -> torch.Tensor:
    """y [M, N] bf16 for x2 bf16 [M, K] contiguous and ``native.pack_int8_grouped``'s tensors (scales float32 or
    float16; optional mins of the same dtype)."""
    empty = _NO_MINS_HALF if t["scales"].dtype == torch.float16 else _NO_MINS
    return call_native(i8_module(), "int8_grouped_linear_i8", x2, t["codes"], t["scales"], t.get("mins", empty),
                       group)


def quantize_activations_i8(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes [M, K], float32 scales [M, K / 32]) of x2 bf16 [M, K] exactly as the kernels quantize them."""
    q, s = i8_module().quantize_activations_i8(x2)
    return q, s
