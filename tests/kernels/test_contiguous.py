"""cinq/kernels/contiguous.py (and contiguous_decode.cpp, and the Triton kernels) over the virtual-contiguous
layout, against the float64 reference reading the same cache as one block of slot_tokens per sequence."""

from __future__ import annotations

import pytest
import torch

from cinq.engine.kv_cache_virtual import VirtualKVRegion
from cinq.kernels import contiguous
from cinq.kernels.backends import get_backend
from cinq.kernels.cpu_native import native_module
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.paged import write_kv_index_copy
from cinq.kernels.reference import paged_attention_reference


def virtual_case(query_lens: list[int], seq_lens: list[int], hq: int, hkv: int, d: int,
                 dtype: torch.dtype = torch.float32, slot_tokens: int = 128, ql: int = 1, seed: int = 0):
    """A step over a real virtual region: sequences on scattered slots, every position outside a context NaN (a
    kernel that reads past its sequence's length or into another slot turns its output NaN)."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = len(seq_lens) + 2
    region = VirtualKVRegion(1, num_slots, slot_tokens, hkv, d, dtype)
    cache = region.layer_views()[0]
    cache.fill_(float("nan"))
    slots = torch.randperm(num_slots, generator=gen)[:len(seq_lens)].tolist()
    for slot, n in zip(slots, seq_lens):
        cache[:, slot, :n] = torch.randn(2, n, hkv, d, generator=gen).to(dtype)
    meta = AttentionMetadata.from_lens(query_lens, seq_lens, [[s] for s in slots], slot_tokens, "cpu", ql)
    t = sum(query_lens)
    q = torch.randn(t, hq, d, generator=gen).to(dtype)
    k = torch.randn(t, hkv, d, generator=gen).to(dtype)
    v = torch.randn(t, hkv, d, generator=gen).to(dtype)
    write_kv_index_copy(k, v, cache, meta.slot_mapping)
    return q, k, v, cache, meta, d ** -0.5


def err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if torch.isnan(out).any():
        return float("inf")
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


STEPS = [  # (query_lens, seq_lens, decode_query_len): decodes, multi-row decodes, prefill chunks after a prefix
    ([1, 1, 1], [70, 1, 33], 1),
    ([3, 3], [40, 3], 3),
    ([1, 5, 9], [20, 5, 60], 1),
]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("query_lens,seq_lens,ql", STEPS)
def test_matches_reference(native: bool, dtype: torch.dtype, query_lens, seq_lens, ql, monkeypatch) -> None:
    if not native:  # the torch fallback: SDPA per sequence on the views
        monkeypatch.setattr(contiguous, "contiguous_decode_native", lambda *a: None)
    q, k, v, cache, meta, scale = virtual_case(query_lens, seq_lens, 8, 2, 64, dtype, ql=ql, seed=len(seq_lens))
    out = get_backend("contiguous").forward(q, k, v, cache, meta, scale)
    ref, _ = paged_attention_reference(q, cache, meta, scale)
    assert err(out, ref) <= (1e-5 if dtype == torch.float32 else 2e-2)


def test_native_decode_refuses_a_length_past_the_slot() -> None:
    q, _, _, cache, meta, scale = virtual_case([1], [10], 4, 2, 16, slot_tokens=32)
    if native_module("contiguous_decode") is None:
        pytest.skip("native kernels unavailable")
    with pytest.raises(RuntimeError, match="seq_len 33"):
        contiguous.contiguous_decode_native(q, cache, torch.tensor([0]), torch.tensor([33]), scale)


@pytest.mark.parametrize("query_lens,seq_lens,ql", [([1, 1], [40, 7], 1), ([1, 6], [9, 30], 1)])
def test_triton_kernels_read_the_virtual_layout(query_lens, seq_lens, ql) -> None:
    """The Triton path (interpreted here): the paged kernels with block size = slot_tokens and a one-entry table."""
    pytest.importorskip("triton")
    from cinq.kernels.triton.decode import paged_decode
    from cinq.kernels.triton.prefill import flash_prefill_paged

    q, _, _, cache, meta, scale = virtual_case(query_lens, seq_lens, 4, 2, 16, slot_tokens=64, ql=ql, seed=3)
    out = torch.full_like(q, float("nan"))
    paged_decode(q, cache, meta, scale, out, num_splits=1)
    if meta.num_seqs > meta.num_decodes:
        flash_prefill_paged(q, cache, meta, scale, out, first_seq=meta.num_decodes)
    ref, _ = paged_attention_reference(q, cache, meta, scale)
    assert err(out, ref) <= 1e-5
