from __future__ import annotations

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.flash import flash_attention, flash_attention_paged, flash_attention_varlen
from cinq.kernels.reference import attention_reference, paged_attention_reference, varlen_attention_reference

TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _qkv(lq: int, lk: int, hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, h, d, generator=g).to(dtype) for n, h in ((lq, hq), (lk, hkv), (lk, hkv)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("lq,lk,causal", [(1, 1, True), (7, 7, True), (129, 129, True), (300, 300, True),
                                          (33, 250, True), (1, 77, True), (50, 90, False)])
@pytest.mark.parametrize("hq,hkv,d", [(2, 2, 64), (8, 2, 80), (8, 1, 128)])
def test_flash_matches_reference(dtype: torch.dtype, lq: int, lk: int, causal: bool, hq: int, hkv: int, d: int,
                                 rel_err) -> None:
    q, k, v = _qkv(lq, lk, hq, hkv, d, dtype, seed=lq * 1000 + lk + d)
    ref, ref_lse = attention_reference(q, k, v, d ** -0.5, causal)
    # small tiles so that every shape crosses several tile boundaries, diagonal tiles included
    out, lse = flash_attention(q, k, v, d ** -0.5, causal, block_m=32, block_n=16)
    assert out.dtype == dtype
    assert rel_err(out, ref) <= TOL[dtype]
    assert torch.allclose(lse.double(), ref_lse, atol=1e-4 if dtype != torch.float64 else 1e-10)


def test_tile_sizes_do_not_change_the_result(rel_err) -> None:
    q, k, v = _qkv(100, 100, 4, 2, 32, torch.float64, seed=1)
    a, _ = flash_attention(q, k, v, 0.2, block_m=1, block_n=1)
    b, _ = flash_attention(q, k, v, 0.2, block_m=100, block_n=100)
    c, _ = flash_attention(q, k, v, 0.2, block_m=17, block_n=5)
    assert rel_err(a, b) < 1e-13 and rel_err(c, b) < 1e-13


def test_varlen_handles_one_token_prompts_and_lengths_up_to_300(rel_err) -> None:
    lens = [1, 300, 1, 17, 64, 2, 129]
    g = torch.Generator().manual_seed(3)
    t = sum(lens)
    q, k, v = (torch.randn(t, h, 64, generator=g) for h in (8, 2, 2))
    cu = torch.tensor([0] + lens).cumsum(0)
    out, lse = flash_attention_varlen(q, k, v, cu, cu, 0.125, block_m=64, block_n=32)
    ref, ref_lse = varlen_attention_reference(q, k, v, cu, cu, 0.125)
    assert rel_err(out, ref) <= 1e-5
    assert torch.allclose(lse.double(), ref_lse, atol=1e-4)


def test_paged_returns_lse_of_every_token(paged_case, rel_err) -> None:
    case = paged_case([1, 1, 40, 1], [1, 45, 70, 1], 8, 2, 64, block_size=16, seed=4)
    out = torch.full_like(case.query, float("nan"))
    got, lse = flash_attention_paged(case.query, case.kv_cache, case.meta, case.scale, out=out, block_m=16,
                                     block_n=16)
    ref, ref_lse = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    assert got is out and rel_err(out, ref) <= 1e-5
    assert torch.allclose(lse.double(), ref_lse, atol=1e-4)


def test_extra_memory_grows_linearly_not_quadratically(largest_tensor) -> None:
    """The largest intermediate of flash is a tile or the output (linear in N); naive builds N x N scores."""
    sizes = {}
    for n in (512, 1024):
        q, k, v = _qkv(n, n, 2, 1, 16, torch.float32, seed=n)
        with largest_tensor() as flash_probe:
            flash_attention(q, k, v, 0.25, block_m=64, block_n=64)
        with largest_tensor() as naive_probe:
            attention_reference(q, k, v, 0.25)
        sizes[n] = (flash_probe.numel, naive_probe.numel)
    assert sizes[1024][1] >= 2 * 1024 * 1024  # heads x N x N scores
    assert sizes[1024][1] / sizes[512][1] == pytest.approx(4.0, rel=0.05)
    assert sizes[1024][0] <= max(2 * 1024 * 16, 2 * 64 * 64)  # inputs/outputs [N, H, D] or one score tile
    assert sizes[1024][0] / sizes[512][0] <= 2.05


def test_rejects_bad_shapes() -> None:
    q, k, v = _qkv(5, 4, 2, 2, 8, torch.float32, seed=0)
    with pytest.raises(InvalidParameterError, match="query length"):
        flash_attention(q, k, v, 1.0)
    q, k, v = _qkv(4, 4, 3, 2, 8, torch.float32, seed=0)
    with pytest.raises(InvalidParameterError, match="multiple"):
        flash_attention(q, k, v, 1.0)
    with pytest.raises(InvalidParameterError, match="block_m"):
        flash_attention(q[:, :2], k, v, 1.0, block_m=0)
