"""AWQ: scale folding is exact in float, the clip search lowers group output error, and the whole method gives
a lower block output error than RTN on the same calibration data."""

from __future__ import annotations

import copy

import torch

from cinq.quant.awq import AWQStats, _fold, awq_block, search_clip
from cinq.quant.calibration import BLOCK_LINEARS, BlockState, CheckpointReader, block_linears, capture_inputs, run_block
from cinq.quant.rtn import fake_quantize, rtn_quantize


def _err(a: BlockState, b: BlockState) -> float:
    return float(((a.hidden + a.residual) - (b.hidden + b.residual)).pow(2).mean())


def test_folding_scales_keeps_the_float_block(random_tiny, calib_tokens):
    # Qwen2 layout (MHA, q/k/v biases): every fold is exact, v -> o included (v's bias is scaled too).
    reader = CheckpointReader(random_tiny)
    state = BlockState.from_tokens(reader, calib_tokens[:4])
    block = reader.block(0)
    ref = run_block(block, state)
    lin = block_linears(block)
    gen = torch.Generator().manual_seed(0)

    def s(n: int) -> torch.Tensor:
        return torch.rand(n, generator=gen) + 0.5
    _fold(block.input_layernorm, [lin[n] for n in BLOCK_LINEARS[0]], s(64))
    _fold(lin["self_attn.v_proj"], [lin["self_attn.o_proj"]], s(64))
    _fold(block.post_attention_layernorm, [lin[n] for n in BLOCK_LINEARS[2]], s(64))
    _fold(lin["mlp.up_proj"], [lin["mlp.down_proj"]], s(128))
    assert _err(run_block(block, state), ref) < 1e-10
    assert float((lin["mlp.down_proj"].weight - reader.block(0).mlp.down_proj.weight).detach().abs().max()) > 1e-3


def test_clip_search_lowers_group_output_error():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(32, 128, generator=gen)
    w[:, 7] *= 8  # an outlier weight column stretches every group-0 range
    x = torch.randn(256, 128, generator=gen)
    ratio = search_clip(w, x, 4, 32, sym=False, n_grid=20)
    assert ratio.shape == (4, 32) and float(ratio.min()) >= 0.5 and float(ratio.max()) <= 1.0
    assert float(ratio.min()) < 1.0  # some ranges were worth shrinking
    clipped = rtn_quantize(w, 4, 32, sym=False, clip_ratio=ratio).dequantize()
    plain = rtn_quantize(w, 4, 32, sym=False).dequantize()
    assert float(((x @ (clipped - w).t()) ** 2).mean()) < float(((x @ (plain - w).t()) ** 2).mean())


def test_awq_block_beats_rtn_with_salient_channels(trained_tiny, calib_tokens):
    reader = CheckpointReader(trained_tiny)
    state = BlockState.from_tokens(reader, calib_tokens)
    block = reader.block(0)
    # Plant salient channels (as LLMs have): a few hidden channels 20x larger in the block's input.
    state.hidden[..., :4] *= 20
    ref = run_block(block, state)

    rtn_block = copy.deepcopy(block)
    with torch.no_grad():
        for lin in block_linears(rtn_block).values():
            lin.weight.copy_(fake_quantize(lin.weight, 4, 32, sym=False))
    stats = AWQStats(keep_windows=8)
    with capture_inputs(block, [names[0] for names in BLOCK_LINEARS], stats):
        run_block(block, state)
    weights = awq_block(block, stats, state.positions, 4, 32, sym=False, n_grid=10, clip=True)
    assert set(weights) == set(block_linears(block))
    # awq_block leaves the block holding its quantized (dequantized) weights with the scales folded in.
    e_awq, e_rtn = _err(run_block(block, state), ref), _err(run_block(rtn_block, state), ref)
    assert e_awq < 0.9 * e_rtn, (e_awq, e_rtn)
