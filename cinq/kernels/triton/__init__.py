"""Triton kernels (the CUDA path): varlen flash prefill, paged decode with split-K, the paged KV write.

Importing this package does not import triton, so ``cinq`` imports on machines without it; the kernel modules
(``prefill``, ``decode``, ``kv_write``) import it. ``@triton.jit`` decides at import time whether a kernel is
compiled or interpreted: set ``TRITON_INTERPRET=1`` *before* importing them to run them on CPU tensors with the
Triton interpreter (slow: tests use tiny shapes).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from cinq.errors import InvalidParameterError


def triton_available() -> bool:
    """Whether the ``triton`` package is installed (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for the interpreter (read once by each kernel module at import)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def check_device(t: torch.Tensor, interpreted: bool) -> None:
    """Compiled kernels need CUDA tensors; interpreted ones run on CPU tensors."""
    if not interpreted and t.device.type != "cuda":
        raise InvalidParameterError(
            f"attention backend 'triton': tensors must be on a CUDA device, got {t.device}; use 'sdpa' on CPU "
            "(or set TRITON_INTERPRET=1 before importing cinq's Triton kernels to run them interpreted)",
            param="attention_backend")


def check_attention_inputs(q: torch.Tensor, kv_dtype: torch.dtype, out: torch.Tensor, interpreted: bool) -> None:
    """The attention kernels' shared checks: the device, float16 / bfloat16 / float32 query and cache, and an
    output whose last dim is contiguous (each failure names its parameter)."""
    check_device(q, interpreted)
    for name, dt in (("query", q.dtype), ("kv_cache", kv_dtype)):
        if dt not in (torch.float16, torch.bfloat16, torch.float32):
            raise InvalidParameterError(
                f"attention backend 'triton': {name} dtype must be float16, bfloat16 or float32, got {dt}",
                param=name)
    if out.stride(-1) != 1:
        raise InvalidParameterError("attention backend 'triton': out needs a contiguous last dim", param="out")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (tile sizes: ``tl.arange`` needs powers of two)."""
    return 1 << max(0, (n - 1).bit_length())
