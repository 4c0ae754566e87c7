"""Triton kernel that stores a step's new K/V rows into the paged cache at their slots (``slot_mapping``).

One program per token copies its ``[Hkv, D]`` key and value rows to ``slot = block * block_size + offset``.
A negative slot means "padding token, do not store" (the convention of CUDA-graph padded batches).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cinq.errors import InvalidParameterError
from cinq.kernels.triton import check_device, interpreter_enabled, next_pow2

INTERPRETED = interpreter_enabled()


@triton.jit
def _write_kv_kernel(key_ptr, value_ptr, cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_c_kv, stride_c_slot, stride_c_h,
                     NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    # (h * 0 + slot) broadcasts the scalar test: the interpreter rejects a scalar-and-tensor mask
    mask = (h < NUM_HEADS) & (d < HEAD_DIM) & ((h * 0 + slot) >= 0)
    dst = cache_ptr + slot * stride_c_slot + h * stride_c_h + d
    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(dst + stride_c_kv, v.to(cache_ptr.dtype.element_ty), mask=mask)


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """key, value: [T, Hkv, D]; kv_cache: [2, num_blocks, block_size, Hkv, D]; slot_mapping: [T] (int32/int64)."""
    check_device(kv_cache, INTERPRETED)
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or key.shape != value.shape or key.dim() != 3 \
            or key.shape[1:] != kv_cache.shape[3:] or slot_mapping.shape != (key.shape[0],):
        raise InvalidParameterError(
            f"write_kv: need key/value [T, {kv_cache.shape[3:]}] and slot_mapping [T]; got key {tuple(key.shape)}, "
            f"value {tuple(value.shape)}, slot_mapping {tuple(slot_mapping.shape)}, kv_cache {tuple(kv_cache.shape)}",
            param="slot_mapping")
    if key.shape[0] == 0:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    if not kv_cache.is_contiguous():
        raise InvalidParameterError("write_kv: kv_cache must be contiguous", param="kv_cache")
    _, _, _, num_heads, head_dim = kv_cache.shape
    _write_kv_kernel[(key.shape[0],)](
        key, value, kv_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kv_cache.stride(0), kv_cache.stride(2), kv_cache.stride(3),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_H=next_pow2(num_heads), BLOCK_D=next_pow2(head_dim))
