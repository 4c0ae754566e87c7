from __future__ import annotations

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
