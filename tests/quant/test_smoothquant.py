"""SmoothQuant: with planted activation outlier channels, smoothed W8A8 is far more accurate than naive W8A8;
smoothing itself is exact in float; static scales come from the smoothed calibration maxima."""

from __future__ import annotations

import torch

from cinq.quant.calibration import BLOCK_LINEARS, BlockState, CheckpointReader, block_linears, capture_inputs, run_block
from cinq.quant.smoothquant import AbsMaxStats, smooth_block, smoothing_scales, w8a8_block, w8a8_fake_matmul


def outlier_activations(n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=gen)
    x[:, [3, 17, 40]] *= 60  # a few channels two orders of magnitude larger, in every token (as in LLMs)
    return x


def test_smoothed_w8a8_error_is_far_below_naive_w8a8():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=gen) * 0.05
    x = outlier_activations(512, 64, seed=1)
    ref = x @ w.t()
    naive = w8a8_fake_matmul(x, w)
    s = smoothing_scales(x.abs().amax(0), [w], alpha=0.5)
    smoothed = w8a8_fake_matmul(x / s, w * s)
    e_naive = float((naive - ref).pow(2).mean())
    e_smooth = float((smoothed - ref).pow(2).mean())
    assert e_smooth < 0.1 * e_naive, (e_smooth, e_naive)
    # Without outliers the two are comparable (smoothing is not magic, it moves range between x and W).
    x_plain = torch.randn(512, 64, generator=gen)
    s_plain = smoothing_scales(x_plain.abs().amax(0), [w], alpha=0.5)
    e0 = float((w8a8_fake_matmul(x_plain, w) - x_plain @ w.t()).pow(2).mean())
    e1 = float((w8a8_fake_matmul(x_plain / s_plain, w * s_plain) - x_plain @ w.t()).pow(2).mean())
    assert e1 < 3 * e0


def test_alpha_moves_difficulty_between_activations_and_weights():
    x_max = torch.tensor([1.0, 100.0])
    w = torch.tensor([[1.0, 1.0]])
    s0 = smoothing_scales(x_max, [w], alpha=0.0)
    s1 = smoothing_scales(x_max, [w], alpha=1.0)
    assert torch.allclose(s0, torch.ones(2))  # alpha 0: activations untouched
    assert torch.allclose(x_max / s1, torch.ones(2))  # alpha 1: activations flattened completely


def test_smooth_block_is_exact_in_float_and_w8a8_block_is_close(trained_tiny, calib_tokens):
    reader = CheckpointReader(trained_tiny)
    state = BlockState.from_tokens(reader, calib_tokens[:8])
    state.hidden[..., [2, 9]] *= 30  # outlier channels entering the norms
    block = reader.block(0)
    ref = run_block(block, state)
    stats = AbsMaxStats()
    with capture_inputs(block, [names[0] for names in BLOCK_LINEARS], stats):
        run_block(block, state)
    after = smooth_block(block, stats, alpha=0.5)
    smoothed = run_block(block, state)
    assert float((smoothed.hidden - ref.hidden).abs().max()) < 1e-4 * float(ref.hidden.abs().max())
    # Smoothed inputs are flatter across channels; o_proj / down_proj inputs are left as they were.
    for names in (BLOCK_LINEARS[0], BLOCK_LINEARS[2]):
        raw, new = stats.absmax[names[0]], after[names[0]]
        assert float(new.max() / new.min()) < 0.5 * float(raw.max() / raw.min())
    for names in (BLOCK_LINEARS[1], BLOCK_LINEARS[3]):
        assert torch.equal(after[names[0]], stats.absmax[names[0]])
    tensors = w8a8_block(block, after, static=True)
    assert set(tensors) == set(block_linears(block))
    t = tensors["self_attn.q_proj"]
    assert t["weight"].dtype == torch.int8 and t["input_scale"].shape == (1,)
    assert torch.isclose(t["input_scale"][0], after["self_attn.q_proj"].max() / 127)
