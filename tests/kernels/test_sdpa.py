from __future__ import annotations

import pytest
import torch

from cinq.kernels import sdpa
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.reference import paged_attention_reference
from cinq.kernels.sdpa import sdpa_decode, sdpa_paged_attention


def test_prompts_take_the_fused_kernel_not_the_quadratic_math_path(paged_case, largest_tensor, rel_err) -> None:
    n = 1024
    for query_lens, seq_lens in (([n], [n]), ([n // 2], [n])):  # a whole prompt; a chunk after a cached prefix
        case = paged_case(query_lens, seq_lens, 2, 1, 16, seed=n)
        with largest_tensor() as probe:
            out = sdpa_paged_attention(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale)
        ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
        assert rel_err(out, ref) <= 1e-5
        # largest allowed: the causal mask of a chunk (q x kv booleans, no heads) or [tokens, heads, D] tensors;
        # the math path would build heads x q x kv scores
        assert probe.numel <= max(query_lens[0] * seq_lens[0], 2 * n * 16 * 2), probe.numel


def test_decode_ignores_whatever_pads_the_cache(paged_case, rel_err) -> None:
    case = paged_case([1, 1, 1], [3, 64, 17], 8, 2, 32, seed=5)  # unused cache slots are NaN
    out = sdpa_decode(case.query, case.kv_cache, case.meta, case.scale)
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    assert rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 80), (6, 1, 32)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_multi_row_decode_is_causal_among_its_rows(native, hq, hkv, d, dtype, tol, paged_case, rel_err,
                                                   monkeypatch) -> None:
    # three query rows per sequence (a 2-token draft plus the bonus row): row r must not see rows after it;
    # seq_len 3 means the rows are the whole context
    case = paged_case([3, 3, 3, 5], [3, 40, 17, 20], hq, hkv, d, dtype, seed=hq + d, decode_query_len=3)
    assert case.meta.num_decodes == 3 and case.meta.num_decode_tokens == 9
    if not native:
        monkeypatch.setattr(sdpa, "paged_decode_native", lambda *a: None)
        case.kv_cache = torch.nan_to_num(case.kv_cache)  # the padded gather reads (masked) padding
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    out = sdpa.sdpa_decode(case.query[:9], case.kv_cache, case.meta, case.scale)
    assert out.shape == (9, hq, d) and rel_err(out, ref[:9]) <= tol
    full = sdpa.sdpa_paged_attention(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale)
    assert rel_err(full, ref) <= tol


def test_multi_row_decode_differs_from_attending_to_everything(paged_case, rel_err) -> None:
    # the bound above is meaningful: dropping the causal mask among the rows moves the output far past it
    case = paged_case([3], [8], 4, 2, 32, seed=3, decode_query_len=3)
    one_row_meta = AttentionMetadata.from_lens([1, 1, 1], [8, 8, 8], [case.meta.block_tables[0].tolist()] * 3, 16)
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    sees_all = sdpa.sdpa_decode(case.query, case.kv_cache, one_row_meta, case.scale)
    assert rel_err(sees_all, ref) > 1e-2


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_ragged_decodes_after_the_decode_group_attend_from_the_pages_in_one_call(dtype, tol, paged_case, rel_err,
                                                                                 monkeypatch) -> None:
    # a speculative step whose requests verify 2, 2, 0, 4 and 1 drafts: the three after the decode group (rows 3)
    # take one native call with their own row counts (no gathered context), causal among each one's rows
    case = paged_case([3, 3, 1, 5, 2], [40, 3, 17, 20, 9], 8, 2, 32, dtype, seed=7, decode_query_len=3)
    assert case.meta.num_decodes == 2
    case.meta.ragged_decodes = True
    calls, real = [], sdpa.paged_decode_varlen_native
    monkeypatch.setattr(sdpa, "paged_decode_varlen_native", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(sdpa, "gather_context", None)  # the chunk path would call it
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    out = sdpa.sdpa_paged_attention(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale)
    assert len(calls) == 1 and calls[0][0].shape[0] == 8
    assert rel_err(out, ref) <= tol
