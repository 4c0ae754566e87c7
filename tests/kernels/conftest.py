"""Shared fixtures for the kernel tests: random paged steps with scattered blocks (attention), thread counts.

Without CUDA, Triton kernels can only run under the interpreter, and ``@triton.jit`` reads TRITON_INTERPRET when
a kernel module is imported, so it is set here, before any test module of this folder imports one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cinq.kernels.metadata import AttentionMetadata  # noqa: E402
from cinq.kernels.paged import write_kv_index_copy  # noqa: E402


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """torch's thread count for the test (the native kernels split their work over it), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@dataclass(slots=True)
class PagedCase:
    """One serving step: new tokens' q/k/v, a cache holding their K/V and the cached prefixes, the metadata."""

    query: torch.Tensor  # [T, Hq, D]
    key: torch.Tensor  # [T, Hkv, D]
    value: torch.Tensor
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, Hkv, D]; slots outside every context hold NaN
    meta: AttentionMetadata
    scale: float


def make_paged_case(query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype = torch.float32, block_size: int = 16, seed: int = 0,
                    device: str = "cpu", decode_query_len: int = 1,
                    tree_mask: torch.Tensor | None = None) -> PagedCase:
    """Random step whose sequences own randomly scattered (non-contiguous, shuffled) blocks; ``tree_mask``
    makes it a tree-verification step (see ``AttentionMetadata``).

    Cache slots no sequence owns, and the tails of partially filled last blocks, are NaN: a kernel that reads
    past a context or outside its block table turns its output NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    need = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(need) + 3  # spare blocks stay NaN
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(perm[at:at + n])
        at += n
    meta = AttentionMetadata.from_lens(query_lens, seq_lens, tables, block_size, device, decode_query_len,
                                       tree_mask)
    cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    flat = cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    for table, seq_len in zip(tables, seq_lens):  # the cached prefix (and, overwritten below, the new tokens)
        for p in range(seq_len):
            slot = table[p // block_size] * block_size + p % block_size
            flat[:, slot] = torch.randn(2, num_kv_heads, head_dim, generator=gen).to(dtype)
    t = sum(query_lens)
    query = torch.randn(t, num_heads, head_dim, generator=gen).to(dtype)
    key = torch.randn(t, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(t, num_kv_heads, head_dim, generator=gen).to(dtype)
    write_kv_index_copy(key, value, cache, meta.slot_mapping.cpu())
    return PagedCase(query.to(device), key.to(device), value.to(device), cache.to(device), meta, head_dim ** -0.5)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, in float64; NaN anywhere in ``out`` gives inf."""
    if torch.isnan(out).any():
        return float("inf")
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.fixture
def paged_case() -> Callable[..., PagedCase]:
    return make_paged_case


@pytest.fixture
def rel_err() -> Callable[[torch.Tensor, torch.Tensor], float]:
    return relative_error


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny kernels run fastest single-threaded, and OpenMP threads spinning against other jobs on a shared
    2-core machine slow them down a hundredfold; restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op produces: the memory footprint an algorithm cannot hide."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in tree_leaves(result):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return result


@pytest.fixture
def largest_tensor() -> type[LargestTensor]:
    return LargestTensor
