from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cinq.errors import InvalidParameterError
from cinq.kernels.paged import gather_context
from cinq.kernels.reference import attention_reference, paged_attention_reference, varlen_attention_reference


def _qkv(lq: int, lk: int, hq: int, hkv: int, d: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(lq, hq, d, generator=g, dtype=torch.float64),
            torch.randn(lk, hkv, d, generator=g, dtype=torch.float64),
            torch.randn(lk, hkv, d, generator=g, dtype=torch.float64))


def test_matches_explicit_softmax_loop() -> None:
    q, k, v = _qkv(3, 5, 2, 1, 4)
    out, lse = attention_reference(q, k, v, scale=0.5)
    for i in range(3):  # query i at position 2 + i sees keys 0 .. 2 + i
        for h in range(2):
            scores = [0.5 * float(q[i, h] @ k[j, 0]) for j in range(3 + i)]
            norm = sum(math.exp(s) for s in scores)
            expect = sum(math.exp(s) / norm * v[j, 0] for j, s in enumerate(scores))
            assert torch.allclose(out[i, h], expect, atol=1e-12)
            assert lse[h, i].item() == pytest.approx(math.log(norm), abs=1e-12)


def test_causal_self_attention_matches_torch() -> None:
    q, k, v = _qkv(37, 37, 4, 4, 16)
    out, _ = attention_reference(q, k, v, scale=0.25)
    expect = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                            is_causal=True, scale=0.25).transpose(0, 1)
    assert torch.allclose(out, expect, atol=1e-12)


def test_gqa_equals_repeated_kv_heads_and_non_causal_sees_everything() -> None:
    q, k, v = _qkv(6, 9, 8, 2, 8)
    gqa, _ = attention_reference(q, k, v, 0.3, causal=False)
    mha, _ = attention_reference(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), 0.3, causal=False)
    assert torch.allclose(gqa, mha, atol=1e-12)
    full = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(4, 1).transpose(0, 1),
                                          v.repeat_interleave(4, 1).transpose(0, 1), scale=0.3).transpose(0, 1)
    assert torch.allclose(gqa, full, atol=1e-12)


def test_a_chunk_equals_the_tail_of_the_full_prompt() -> None:
    q, k, v = _qkv(20, 20, 2, 2, 8)
    whole, whole_lse = attention_reference(q, k, v, 0.35)
    tail, tail_lse = attention_reference(q[-6:], k, v, 0.35)
    assert torch.allclose(tail, whole[-6:], atol=1e-12)
    assert torch.allclose(tail_lse, whole_lse[:, -6:], atol=1e-12)


def test_varlen_is_per_sequence() -> None:
    q, k, v = _qkv(10, 10, 2, 1, 8)
    cu = torch.tensor([0, 1, 7, 10])
    out, lse = varlen_attention_reference(q, k, v, cu, cu, 0.35)
    for a, b in [(0, 1), (1, 7), (7, 10)]:
        o, l = attention_reference(q[a:b], k[a:b], v[a:b], 0.35)
        assert torch.allclose(out[a:b], o) and torch.allclose(lse[:, a:b], l)


def test_paged_equals_dense_on_the_gathered_context(paged_case) -> None:
    case = paged_case([1, 4, 9], [30, 20, 9], 4, 2, 8, torch.float64, block_size=4)
    out, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    assert not torch.isnan(out).any()  # the NaN-poisoned slots outside every context were never read
    starts = case.meta.query_start_loc.tolist()
    for i, seq_len in enumerate(case.meta.seq_lens_cpu):
        k, v = gather_context(case.kv_cache, case.meta.block_tables[i], seq_len)
        o, _ = attention_reference(case.query[starts[i]:starts[i + 1]], k, v, case.scale)
        assert torch.equal(out[starts[i]:starts[i + 1]], o)


def test_rejects_more_queries_than_keys_when_causal() -> None:
    q, k, v = _qkv(4, 3, 1, 1, 4)
    with pytest.raises(InvalidParameterError, match="query length"):
        attention_reference(q, k, v, 1.0)
