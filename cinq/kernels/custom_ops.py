"""The native CPU kernels (``cinq.kernels.cpu_native``) as torch custom ops, ``torch.ops.cinq.*``: the one place
they are registered, with the fake (shape-only) version of each that ``torch.compile`` traces through.

The linears are registered in C++ by their extensions (see the end of this module); the rest here, in Python.
A pybind function is opaque to dynamo (a graph break per call); a registered op is one node of the graph, and its
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


@torch.library.custom_op("cinq::rms_norm", mutates_args=(), device_types="cpu")
def rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(norm(x + residual) * weight, x + residual); ``residual`` empty: (norm(x) * weight, empty)."""
    y, res = _module("rms_norm").rms_norm(x, residual, weight, eps)
    return y, res


@rms_norm.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), (x.new_empty(x.shape) if residual.numel() else x.new_empty(0))


@torch.library.custom_op("cinq::rotary_", mutates_args=("q", "k"), device_types="cpu")
def rotary_(q: Tensor, k: Tensor, positions: Tensor, cos_sin: Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by ``cos_sin[positions]``."""
    _module("rotary").rotary_(q, k, positions, cos_sin)


@rotary_.register_fake
def _(q: Tensor, k: Tensor, positions: Tensor, cos_sin: Tensor) -> None:
    return None


@torch.library.custom_op("cinq::write_kv", mutates_args=("kv_cache",), device_types="cpu")
def write_kv(key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
    """Store key / value [T, Hkv, D] into the paged ``kv_cache`` at ``slot_mapping``."""
    _module("kv_write").write_kv(key, value, kv_cache, slot_mapping)


@write_kv.register_fake
def _(key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
    return None


@torch.library.custom_op("cinq::paged_decode", mutates_args=(), device_types="cpu")
def paged_decode(query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float,
                 query_len: int, tree_mask: Tensor) -> Tensor:
    """Decode attention [nd * query_len, Hq, D] read from the pages (``cpu_native.paged_decode_native``)."""
    return _module("paged_decode").paged_decode(query, kv_cache, block_tables, seq_lens, scale, query_len, tree_mask)


@paged_decode.register_fake
def _(query: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float, query_len: int,
      tree_mask: Tensor) -> Tensor:
    return query.new_empty(query.shape)


# The linears (small_m_linear, int4_affine_linear, int8_grouped_linear) register their ops in C++, with schemas and
# Meta kernels, when their extension loads (cinq/kernels/cpu/small_m_gemm.cpp, grouped_int_linear.cpp): compiled code
# then calls them through the dispatcher alone (~10 us a call less than a Python custom op, the one that runs ~20
# times per decode step). Loaded here so that importing this module registers every op, as before.
for _name in ("small_m_gemm", "grouped_int_linear", "int8_activation_linear"):
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
