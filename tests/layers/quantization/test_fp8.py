"""FP8 e4m3: the quantization arithmetic, the native kernel (e4m3 decoded in registers, subnormals included), the
CUDA dispatch (``torch._scaled_mm`` where the GPU has FP8; its call runs on the CPU too), ``FP8Linear`` with merged
per-tensor scales, and the ``quantization_config`` both ways (compressed-tensors' own parser validates ours)."""

from __future__ import annotations

import pytest
import torch

from cinq.layers.quantization.fp8 import (E4M3, cuda_kind, fp8_dequantize, fp8_quantize, quantize_input,
                                          scaled_mm)
from cinq.layers.quantization.format import QuantFormat
from cinq.layers.quantization.fp8_linear import FP8Linear
from cinq.layers.weight_loader import CheckpointTensor, OutputShards


def test_all_256_codes_decode_like_torch():
    from cinq.layers.quantization import native_float
    if not native_float.float_kernels_available():
        pytest.skip("native float-code kernels unavailable here")
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F].reshape(-1)[:240].reshape(15, 16)  # NaN codes left out
    eye = torch.eye(16, dtype=torch.bfloat16)
    y = native_float.fp8_linear(eye, codes.contiguous(), torch.ones(15)).float().t()  # row n = code row n
    assert torch.equal(y, codes.view(E4M3).float().to(torch.bfloat16).float())


def test_native_kernel_against_the_dequantized_weight():
    from cinq.layers.quantization import native_float
    if not native_float.float_kernels_available():
        pytest.skip("native float-code kernels unavailable here")
    gen = torch.Generator().manual_seed(1)
    for n, k, m, strategy in [(37, 64, 1, "tensor"), (101, 256, 5, "channel"), (1001, 576, 9, "channel")]:
        q, s = fp8_quantize(torch.randn(n, k, generator=gen), strategy)
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        rs = torch.rand(m, generator=gen) + 0.5
        y = native_float.fp8_linear(x, q.view(torch.uint8), s.expand(n).contiguous(), rs).float()
        ref = (x.float() @ fp8_dequantize(q, s).t()) * rs.unsqueeze(1)
        assert (y - ref).abs().max() <= 2 ** -8 * ref.abs().max(), (n, k, m)


def test_quantize_round_trip_and_activation_scales():
    w = torch.randn(16, 64) * torch.logspace(-3, 1, 16).unsqueeze(1)
    for strategy in ("tensor", "channel"):
        q, s = fp8_quantize(w, strategy)
        assert q.dtype == E4M3 and s.numel() == (16 if strategy == "channel" else 1)
        rel = ((fp8_dequantize(q, s) - w).abs() / w.abs().amax(1, keepdim=True)).amax()
        assert rel < (2 ** -4 if strategy == "channel" else 1.0)  # 3 mantissa bits per channel's own range
    xq, xs = quantize_input(torch.tensor([[1.0, -4.0], [0.5, 0.25]]), None)
    assert torch.equal(xs.reshape(-1), torch.tensor([4 / 448, 0.5 / 448]))
    assert torch.equal(xq.float()[:, 1], torch.tensor([-448.0, 224.0]))
    xq, xs = quantize_input(torch.tensor([[1000.0]]), torch.tensor([1.0]))
    assert float(xq.float()) == 448.0  # static scales clip


def test_cuda_dispatch_and_the_scaled_mm_call():
    assert cuda_kind((9, 0), 64, 128, "dynamic") == "fp8_scaled_mm"
    assert cuda_kind((8, 9), 64, 128, "static") == "fp8_scaled_mm"
    assert cuda_kind((8, 0), 64, 128, "dynamic") == "fp8_dequant"  # A100: no FP8 tensor cores
    assert cuda_kind((9, 0), 60, 128, "dynamic") == "fp8_dequant"  # N not a multiple of 16
    assert cuda_kind((9, 0), 64, 128, "none") == "fp8_dequant"  # weight-only: no FP8 activations
    assert cuda_kind((9, 0), 64, 128, "dynamic", has_scaled_mm=False) == "fp8_dequant"
    gen = torch.Generator().manual_seed(2)
    q, s = fp8_quantize(torch.randn(32, 64, generator=gen), "channel")
    x = torch.randn(3, 64, generator=gen)
    xq, xs = quantize_input(x, None)
    try:
        y = scaled_mm(xq, xs, q, s.reshape(1, -1), torch.bfloat16).float()
    except (RuntimeError, NotImplementedError) as e:  # builds without a CPU _scaled_mm
        pytest.skip(f"torch._scaled_mm unavailable on the CPU here: {e}")
    ref = (xq.float() @ q.float().t()) * xs * s.reshape(1, -1)
    assert (y - ref).abs().max() <= 2 ** -8 * ref.abs().max()


@pytest.mark.parametrize("act", ["dynamic", "static", "none"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_merged_layer_keeps_each_shards_scale(act, dtype):
    gen = torch.Generator().manual_seed(4)
    ws = {"gate": torch.randn(32, 64, generator=gen), "up": torch.randn(48, 64, generator=gen) * 5}
    layer = FP8Linear(64, 80, False, act, "gate_up", compute_dtype=dtype,
                      output_shards=OutputShards(("gate", "up"), (32, 48)))
    parts = {}
    for shard, w in ws.items():
        q, s = fp8_quantize(w, "tensor")
        parts[shard] = (q, s)
        layer.weight_loader("weight", CheckpointTensor.in_memory("w", q), shard)
        layer.weight_loader("weight_scale", CheckpointTensor.in_memory("s", s.reshape(())), shard)
        if act == "static":
            layer.weight_loader("input_scale", CheckpointTensor.in_memory("i", torch.tensor(0.01 * len(shard))),
                                shard)
    layer.process_weights_after_loading()
    dense = torch.cat([fp8_dequantize(q, s) for q, s in parts.values()])
    x = torch.randn(4, 64, generator=gen).to(dtype)
    if act == "none":
        ref = x.float() @ dense.t()
    else:
        xq, xs = quantize_input(x, torch.tensor([0.04]) if act == "static" else None)  # the larger input scale
        ref = (xq.float() @ dense.t()) * xs
    y = layer(x).float()
    assert (y - ref).abs().max() <= 0.01 * ref.abs().max()


def test_config_round_trip_and_compressed_tensors_validates_it():
    for kw in ({"weight_strategy": "tensor", "act_scheme": "dynamic"},
               {"weight_strategy": "tensor", "act_scheme": "static"},
               {"weight_strategy": "channel", "act_scheme": "dynamic"},
               {"weight_strategy": "channel", "act_scheme": "none"}):
        f = QuantFormat(method="fp8", **kw)
        back = QuantFormat.from_hf(f.to_hf())
        assert (back.format, back.weight_strategy, back.act_scheme) == (f.format, f.weight_strategy, f.act_scheme)
    assert QuantFormat(method="fp8", act_scheme="dynamic").format == "fp8"  # vLLM's own
    ct = pytest.importorskip("compressed_tensors")
    f = QuantFormat(method="fp8", weight_strategy="channel", act_scheme="dynamic")
    cfg = ct.QuantizationConfig.model_validate({k: v for k, v in f.to_hf().items() if k != "meta"})
    (group,) = cfg.config_groups.values()
    assert group.weights.type == "float" and group.weights.strategy == "channel"
    assert group.input_activations.dynamic and group.input_activations.strategy == "token"
    with pytest.raises(Exception, match="weight_block_size"):
        QuantFormat.from_hf({"quant_method": "fp8", "weight_block_size": [128, 128]})
