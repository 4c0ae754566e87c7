"""Round-to-nearest grids: error bounds, zero points, groups."""

from __future__ import annotations

import pytest
import torch

from cinq.quant.rtn import fake_quantize, rtn_quantize


@pytest.mark.parametrize("bits,group,sym", [(4, 32, True), (4, 32, False), (4, -1, True), (8, 64, False),
                                            (8, -1, True), (4, 40, False)])
def test_error_is_at_most_half_a_step_inside_the_grid(bits, group, sym):
    w = torch.randn(12, 160, generator=torch.Generator().manual_seed(bits + group))
    qw = rtn_quantize(w, bits, group, sym)
    deq = qw.dequantize()
    step = qw.scales[qw.g_idx.long()].t()
    err = (deq - w).abs()
    if sym:  # GPTQ's symmetric grid reaches -2^(b-1) s .. (2^(b-1)-1) s: the top value may clip by one step
        assert bool((err <= step + 1e-6).all())
        assert bool((qw.zeros == (1 << (bits - 1))).all())
    else:
        assert bool((err <= step / 2 + 1e-6).all())
    assert int(qw.qweight.max()) <= (1 << bits) - 1
    assert torch.allclose(fake_quantize(w, bits, group, sym), deq, atol=1e-6)


def test_groups_have_their_own_scales():
    w = torch.randn(4, 64)
    w[:, 32:] *= 100
    qw = rtn_quantize(w, 4, 32, sym=True)
    assert qw.num_groups == 2
    assert bool((qw.scales[1] > 20 * qw.scales[0]).all())
    assert (qw.dequantize()[:, :32] - w[:, :32]).abs().max() < 0.5  # small group not drowned by the big one


def test_more_bits_and_smaller_groups_mean_less_error():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    e = {key: float((rtn_quantize(w, *key).dequantize() - w).pow(2).mean())
         for key in [(4, -1, True), (4, 128, True), (4, 32, True), (8, -1, True)]}
    assert e[(8, -1, True)] < e[(4, 32, True)] < e[(4, 128, True)] < e[(4, -1, True)]


def test_zero_rows_are_exact_and_asymmetric_grids_hit_both_ends():
    w = torch.zeros(3, 32)
    assert torch.equal(rtn_quantize(w, 4, 32, sym=True).dequantize(), w)
    w[1] = 0.25  # a constant row: the asymmetric grid [0, 0.25] holds it exactly
    w[2, :16] = -0.5
    w[2, 16:] = 0.75
    assert torch.allclose(rtn_quantize(w, 4, 32, sym=False).dequantize(), w, atol=1e-6)
