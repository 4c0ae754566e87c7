"""GPTQ: lower Hessian-weighted (= calibration output) error than RTN on the same data, act-order /
static-groups semantics of g_idx, dampening retries, and the block-level driver."""

from __future__ import annotations

import pytest
import torch

from cinq.quant.gptq import HessianAccumulator, gptq_block, gptq_quantize
from cinq.quant.rtn import rtn_quantize


def correlated_inputs(n: int, k: int, seed: int) -> torch.Tensor:
    """Activations with correlated channels of very different magnitudes (as in real layers)."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=gen) / k ** 0.5
    mags = torch.rand(k, generator=gen) * 4 + 0.1
    return (torch.randn(n, k, generator=gen) @ mix) * mags


def output_error(w_hat: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> float:
    return float(((x @ (w_hat - w).t()) ** 2).mean())


@pytest.fixture(scope="module")
def layer():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 128, generator=gen) * 0.05
    x = correlated_inputs(2048, 128, seed=1)
    acc = HessianAccumulator(128)
    for chunk in x.split(300):
        acc.add(chunk)
    return w, x, acc.h


def test_hessian_accumulator_is_2_xtx_over_n(layer):
    _, x, h = layer
    assert torch.allclose(h, 2 * x.t() @ x / x.shape[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bits,group,sym,desc_act,static", [
    (4, 32, True, False, False), (4, 32, False, False, False), (4, -1, True, False, False),
    (4, 32, True, True, False), (4, 32, True, True, True), (8, -1, True, False, False), (4, 48, False, True, False),
])
def test_gptq_beats_rtn_on_the_calibration_output_error(layer, bits, group, sym, desc_act, static):
    w, x, h = layer
    qw, loss = gptq_quantize(w, h, bits, group, sym, desc_act, static, lazy_batch_size=32)
    rtn = rtn_quantize(w, bits, group, sym)
    e_gptq = output_error(qw.dequantize(), w, x)
    e_rtn = output_error(rtn.dequantize(), w, x)
    assert e_gptq < 0.8 * e_rtn, (e_gptq, e_rtn)
    assert loss.shape == (48,) and bool((loss >= 0).all()) and float(loss.sum()) > 0
    # The codes and grids are a valid quantized weight: dequantize() is what gets stored and served.
    assert int(qw.qweight.max()) < (1 << bits) and qw.g_idx.shape == (128,)


def test_desc_act_groups_follow_the_permuted_order(layer):
    w, _, h = layer
    qw, _ = gptq_quantize(w, h, 4, 32, desc_act=True)
    perm = torch.argsort(torch.diag(h), descending=True)
    # The 32 channels with the largest Hessian diagonal form group 0, and so on (AutoGPTQ's g_idx).
    assert torch.equal(qw.g_idx[perm].long(), torch.arange(128) // 32)
    assert not qw.has_sequential_groups()
    static, _ = gptq_quantize(w, h, 4, 32, desc_act=True, static_groups=True)
    assert static.has_sequential_groups()  # static groups keep g_idx = k // G


def test_dead_channels_and_singular_hessians_still_quantize():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(16, 64, generator=gen)
    x = torch.randn(8, 64, generator=gen)  # rank 8 << 64: singular H
    x[:, 5] = 0  # a channel that never fires
    h = 2 * x.t() @ x / 8
    qw, _ = gptq_quantize(w, h, 4, 32, damp_percent=1e-9)
    assert torch.isfinite(qw.dequantize()).all()
    assert bool((qw.dequantize()[:, 5] == 0).all())  # a dead channel is pinned to 0 before quantizing
    assert output_error(qw.dequantize(), w, x) < output_error(rtn_quantize(w, 4, 32).dequantize(), w, x)


def test_gptq_block_true_sequential_beats_rtn(trained_tiny, calib_tokens):
    from cinq.quant.calibration import BlockState, CheckpointReader, block_linears, run_block
    reader = CheckpointReader(trained_tiny)
    state = BlockState.from_tokens(reader, calib_tokens)
    block = reader.block(0)
    ref = run_block(block, state)
    rtn_block = reader.block(0)
    with torch.no_grad():
        for lin in block_linears(rtn_block).values():
            lin.weight.copy_(rtn_quantize(lin.weight, 4, 32).dequantize())
    weights, losses = gptq_block(block, state, 4, 32, True, False, False, 0.01, 128, True, batch=4)
    assert set(weights) == set(block_linears(block)) and all(v > 0 for v in losses.values())
    out_gptq = run_block(block, state)
    out_rtn = run_block(rtn_block, state)

    def err(o):
        return float(((o.hidden + o.residual) - (ref.hidden + ref.residual)).pow(2).mean())
    assert err(out_gptq) < err(out_rtn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_block_equals_rerunning_the_block_per_stage(trained_tiny, calib_tokens, dtype):
    """The staged true-sequential path (each piece of the block computed once) gives exactly the weights, losses
    and next-block inputs of re-running the block up to each stage."""
    from cinq.quant.calibration import BlockState, CheckpointReader, run_block
    from cinq.quant.gptq import gptq_block_staged
    reader = CheckpointReader(trained_tiny)
    state = run_block(reader.block(0).to(dtype), BlockState.from_tokens(reader, calib_tokens, dtype), batch=4)
    ref_block, staged_block = reader.block(1).to(dtype), reader.block(1).to(dtype)
    w_ref, l_ref = gptq_block(ref_block, state, 3, 32, True, True, False, 0.01, 128, True, batch=4, staged=False)
    nxt_ref = run_block(ref_block, state, batch=4)
    w, losses, nxt = gptq_block_staged(staged_block, state, 3, 32, True, True, False, 0.01, 128, batch=4)
    assert losses == l_ref and set(w) == set(w_ref)
    for k in w:
        assert torch.equal(w[k].qweight, w_ref[k].qweight) and torch.equal(w[k].scales, w_ref[k].scales), k
        assert torch.equal(w[k].g_idx, w_ref[k].g_idx)
    assert torch.equal(nxt.hidden, nxt_ref.hidden) and torch.equal(nxt.residual, nxt_ref.residual)
