"""The native CPU kernels (``cinq.kernels.cpu_native``) as torch custom ops, ``torch.ops.cinq.*``: the one place
they are registered, with the fake (shape-only) version of each that ``torch.compile`` traces through.

The decode step's kernels are registered in C++ by their extensions (see below); the float-code linears here, in
Python. A pybind function is opaque to dynamo (a graph break per call); a registered op is one node of the graph, and its
declared mutations (``rotary_`` rotates q and k in place, ``write_kv`` stores into the cache) keep the order of
the KV write before the attention that reads it. Eager steps call the extension directly, not through these ops
(``cpu_native.call_native``): the dispatcher's round trip into a Python kernel costs ~10 us a call, more than most
kernels of a batch-1 decode step. Importing this module registers the ops (the compiled decode step does).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cinq.kernels.cpu_native import native_module


def _module(name: str) -> Any:
    mod = native_module(name)
    if mod is None:  # callers check availability before they reach an op; this is a bug, not a user error
        raise RuntimeError(f"torch.ops.cinq: native kernel {name} is unavailable")
    return mod


# The decode step's kernels register their ops in C++, with schemas (the in-place ones declare what they mutate:
# ``rotary_`` q and k, ``write_kv`` the cache, which keeps the KV write before the attention that reads it) and
# Meta kernels, when their extension loads: rms_norm.cpp, rotary.cpp, kv_write.cpp, paged_decode.cpp, and the
# linears (small_m_linear, int4_affine_linear, int8_grouped_linear, the int8-activation ones) in small_m_gemm.cpp,
# grouped_int_linear.cpp and int8_activation_linear.cpp.
# Compiled code then calls them through the dispatcher alone, ~7-10 us a call less than a Python custom op (a
# 30-layer batch-1 step makes ~200 such calls). Loaded here so that importing this module registers every op.
for _name in ("rms_norm", "rotary", "kv_write", "paged_decode", "small_m_gemm", "grouped_int_linear",
              "int8_activation_linear"):
    native_module(_name)


@torch.library.custom_op("cinq::nf4_linear", mutates_args=(), device_types="cpu")
def nf4_linear(x: Tensor, codes: Tensor, absmax: Tensor, levels: Tensor, blocksize: int) -> Tensor:
    """NF4 weights decoded in registers (cinq/kernels/cpu/float_code_linear.cpp; ``native_float.nf4_linear``)."""
    return _module("float_code_linear").nf4_linear(x, codes, absmax, levels, blocksize)


@nf4_linear.register_fake
def _(x: Tensor, codes: Tensor, absmax: Tensor, levels: Tensor, blocksize: int) -> Tensor:
    return x.new_empty((x.shape[0], codes.shape[0]))


@torch.library.custom_op("cinq::fp8_linear", mutates_args=(), device_types="cpu")
def fp8_linear(x: Tensor, codes: Tensor, scale: Tensor, row_scale: Tensor) -> Tensor:
    """FP8 e4m3 weights decoded in registers (float_code_linear.cpp; ``native_float.fp8_linear``)."""
    return _module("float_code_linear").fp8_linear(x, codes, scale, row_scale)


@fp8_linear.register_fake
def _(x: Tensor, codes: Tensor, scale: Tensor, row_scale: Tensor) -> Tensor:
    return x.new_empty((x.shape[0], codes.shape[0]))
