"""cinq/kernels/triton/prefill.py against the float64 reference (interpreted on CPU, tiny shapes)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cinq.errors import InvalidParameterError  # noqa: E402
from cinq.kernels.reference import paged_attention_reference, varlen_attention_reference  # noqa: E402
from cinq.kernels.triton.prefill import flash_prefill_paged, flash_prefill_varlen  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _packed(lens: list[int], heads: int, d: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    return torch.randn(sum(lens), heads, d, generator=g).to(dtype).to(DEVICE)


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lens, device=DEVICE).cumsum(0).to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hq,hkv,d", [(2, 2, 64), (4, 1, 80), (8, 1, 128)])
def test_varlen_causal_matches_reference(dtype: torch.dtype, hq: int, hkv: int, d: int, rel_err) -> None:
    lens = [1, 33, 16, 2]  # a one-token prompt, tiles crossing boundaries, one exact tile
    g = torch.Generator().manual_seed(d + hq)
    q, k, v = _packed(lens, hq, d, dtype, g), _packed(lens, hkv, d, dtype, g), _packed(lens, hkv, d, dtype, g)
    out = torch.full_like(q, float("nan"))
    got, lse = flash_prefill_varlen(q, k, v, _cu(lens), _cu(lens), max(lens), d ** -0.5, out=out, return_lse=True)
    ref, ref_lse = varlen_attention_reference(q.cpu(), k.cpu(), v.cpu(), _cu(lens).cpu(), _cu(lens).cpu(), d ** -0.5)
    assert got is out and rel_err(out.cpu(), ref) <= TOL[dtype]
    assert torch.allclose(lse.cpu().double(), ref_lse, atol=2e-2 if dtype != torch.float32 else 1e-4)


def test_varlen_queries_at_the_end_of_longer_keys_and_non_causal(rel_err) -> None:
    g = torch.Generator().manual_seed(7)
    q_lens, k_lens = [3, 20, 1], [40, 20, 9]
    q, k, v = _packed(q_lens, 4, 64, torch.float32, g), _packed(k_lens, 2, 64, torch.float32, g), \
        _packed(k_lens, 2, 64, torch.float32, g)
    for causal in (True, False):
        out, _ = flash_prefill_varlen(q, k, v, _cu(q_lens), _cu(k_lens), 20, 0.1, causal=causal)
        ref, _ = varlen_attention_reference(q.cpu(), k.cpu(), v.cpu(), _cu(q_lens).cpu(), _cu(k_lens).cpu(), 0.1,
                                            causal=causal)
        assert rel_err(out.cpu(), ref) <= 1e-5


def test_paged_prefill_after_cached_prefix_skips_decodes(paged_case, rel_err) -> None:
    # two decodes first: the prefill kernel must leave their rows alone (they stay NaN here)
    case = paged_case([1, 1, 7, 1, 24], [9, 30, 39, 1, 24], 8, 2, 64, torch.bfloat16, seed=2, device=DEVICE)
    out = torch.full_like(case.query, float("nan"))
    flash_prefill_paged(case.query, case.kv_cache, case.meta, case.scale, out, first_seq=2)
    ref, _ = paged_attention_reference(case.query.cpu(), case.kv_cache.cpu(), case.meta, case.scale)
    assert torch.isnan(out[:2]).all()
    assert rel_err(out[2:].cpu(), ref[2:]) <= 1e-2


def test_rejects_float64_and_bad_head_layout() -> None:
    x = torch.randn(4, 2, 16, dtype=torch.float64, device=DEVICE)
    cu = _cu([4])
    with pytest.raises(InvalidParameterError, match="dtype"):
        flash_prefill_varlen(x, x, x, cu, cu, 4, 1.0)
    q, kv = torch.randn(4, 3, 16, device=DEVICE), torch.randn(4, 2, 16, device=DEVICE)
    with pytest.raises(InvalidParameterError, match="Hq % Hkv"):
        flash_prefill_varlen(q, kv, kv, cu, cu, 4, 1.0)
