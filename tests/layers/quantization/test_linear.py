"""The quantized linear kinds as the loader drives them (built on the meta device, materialised, filled through
their weight loader, then repacked), whole and merged from shards."""

from __future__ import annotations

import pytest
import torch

from cinq.errors import ModelLoadError
from cinq.layers.quantization.linear import AWQLinear, GPTQLinear, W8A8Linear, dequantize_weight_only
from cinq.layers.quantization.packing import awq_pack, gptq_pack, w8a8_pack
from cinq.layers.weight_loader import CheckpointTensor, OutputShards
from cinq.quant.rtn import rtn_quantize


def build_like_loader(cls, *args, dtype=torch.bfloat16, **kwargs):
    with torch.device("meta"):
        module = cls(*args, compute_dtype=dtype, **kwargs)
    return module.to_empty(device="cpu")


def fill(module, tensors):
    expected = dict(module.named_buffers())
    assert set(expected) == set(tensors), (set(expected), set(tensors))
    for name, t in tensors.items():
        assert expected[name].shape == t.shape and expected[name].dtype.is_floating_point == t.dtype.is_floating_point
        module.weight_loader(name, CheckpointTensor.in_memory(name, t))
    module.process_weights_after_loading()
    return module


@pytest.mark.parametrize("bits,group,sym,version", [(4, 32, True, 1), (4, 64, False, 2), (8, -1, False, 1)])
def test_gptq_linear_loads_by_name_and_computes_the_dequantized_product(bits, group, sym, version):
    gen = torch.Generator().manual_seed(bits + group)
    w, b = torch.randn(32, 128, generator=gen), torch.randn(32, generator=gen)
    qw = rtn_quantize(w, bits, group, sym, min_zero=1 if version == 1 else 0)
    tensors = gptq_pack(qw, version)
    tensors["bias"] = b.half()
    lin = fill(build_like_loader(GPTQLinear, 128, 32, True, bits, group, version=version, prefix="l"), tensors)
    assert lin.kind in ("int4_native", "int4_cpu", "int8_native", "int8_cpu")
    assert not any(n in dict(lin.named_buffers()) for n in ("qweight", "qzeros"))  # packed copies dropped
    x = torch.randn(2, 3, 128, generator=gen).bfloat16()
    ref = x.float() @ qw.dequantize().t() + b.half().float()
    y = lin(x)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, 32)
    assert float((y.float() - ref).abs().max() / ref.abs().max()) < 2e-2


def test_awq_linear():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(64, 128, generator=gen)
    qw = rtn_quantize(w, 4, 32, sym=False)
    lin = fill(build_like_loader(AWQLinear, 128, 64, False, 32), awq_pack(qw))
    x = torch.randn(4, 128, generator=gen).bfloat16()
    ref = x.float() @ qw.dequantize().t()
    assert float((lin(x).float() - ref).abs().max() / ref.abs().max()) < 2e-2


@pytest.mark.parametrize("static", [False, True])
def test_w8a8_linear(static):
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(48, 64, generator=gen)
    x = torch.randn(5, 64, generator=gen)
    lin = fill(build_like_loader(W8A8Linear, 64, 48, False, static=static),
               w8a8_pack(w, float(x.abs().max()) / 127 if static else None))
    y = lin(x.bfloat16())
    assert y.dtype == torch.bfloat16
    assert float((y.float() - x @ w.t()).abs().max() / (x @ w.t()).abs().max()) < 5e-2


def test_dequantize_weight_only_keeps_the_function_and_the_w8a8_layers():
    gen = torch.Generator().manual_seed(9)
    w = torch.randn(64, 128, generator=gen)
    model = torch.nn.ModuleDict({
        "gptq4": fill(build_like_loader(GPTQLinear, 128, 64, True, 4, 32, prefix="a", dtype=torch.float32),
                      {**gptq_pack(rtn_quantize(w, 4, 32, True, min_zero=1)), "bias": torch.randn(64).half()}),
        "gptq8": fill(build_like_loader(GPTQLinear, 128, 64, False, 8, -1, prefix="b", dtype=torch.float32),
                      gptq_pack(rtn_quantize(w, 8, -1, False, min_zero=1))),
        "awq": fill(build_like_loader(AWQLinear, 128, 64, False, 32, dtype=torch.float32),
                    awq_pack(rtn_quantize(w, 4, 32, sym=False))),
        "w8a8": fill(build_like_loader(W8A8Linear, 128, 64, False, dtype=torch.float32), w8a8_pack(w, None))})
    x = torch.randn(300, 128, generator=gen)  # training-forward sized: many rows
    before = {name: m(x) for name, m in model.items()}
    kinds = {name: m.kind for name, m in model.items()}
    assert dequantize_weight_only(model) == 3
    for name, m in model.items():
        assert (m.kind == kinds[name]) == (name == "w8a8")  # activation-quantized layers keep their kernel
        torch.testing.assert_close(m(x), before[name], atol=1e-4, rtol=1e-4)
    assert dequantize_weight_only(model) == 0  # already dense: nothing left to convert


def test_quantized_linear_errors():
    with pytest.raises(ModelLoadError, match="q_proj: in_features 100"):
        GPTQLinear(100, 64, False, 4, 32, prefix="q_proj", compute_dtype=torch.float32)
    with pytest.raises(ModelLoadError, match="group_size 48"):
        AWQLinear(128, 64, False, 48, prefix="o", compute_dtype=torch.float32)
    lin = GPTQLinear(64, 32, False, 4, 32, prefix="model.layers.0.mlp.up_proj", compute_dtype=torch.float32)
    with pytest.raises(RuntimeError, match="up_proj: process_weights_after_loading"):
        lin(torch.randn(1, 64))


SHARDS = OutputShards(("q", "k", "v"), (64, 32, 32))


def shard_weights(seed):
    gen = torch.Generator().manual_seed(seed)
    return {s: torch.randn(n, 128, generator=gen) for s, n in zip(SHARDS.ids, SHARDS.sizes)}


def load_merged(module, packed):
    """Fill a merged linear shard by shard (``packed``: shard id -> tensors), as the loader does."""
    for shard_id, tensors in packed.items():
        for name, t in tensors.items():
            module.weight_loader(name, CheckpointTensor.in_memory(f"{shard_id}_proj.{name}", t), shard_id)
    module.process_weights_after_loading()
    return module


def assert_merged_equals_separate(merged, separate, x):
    y = merged(x)
    ys = torch.cat([separate[s](x) for s in SHARDS.ids], dim=-1)
    assert y.shape == ys.shape
    assert torch.equal(y, ys)


@pytest.mark.parametrize("fmt", ["gptq", "gptq_act_order", "awq"])
def test_merged_weight_only_linear_equals_the_separate_ones(fmt):
    w = shard_weights(11)
    gen = torch.Generator().manual_seed(12)
    act_order = torch.argsort(torch.randperm(128, generator=gen)) // 32  # one permutation: q/k/v share H
    packed, separate = {}, {}
    for s, ws in w.items():
        qw = rtn_quantize(ws, 4, 32, sym=fmt == "gptq", min_zero=1)
        if fmt == "gptq_act_order":
            qw.g_idx = act_order.clone()
        if fmt == "awq":
            packed[s] = awq_pack(qw)
            separate[s] = fill(build_like_loader(AWQLinear, 128, ws.shape[0], False, 32), packed[s])
        else:
            packed[s] = gptq_pack(qw, 1)
            separate[s] = fill(build_like_loader(GPTQLinear, 128, ws.shape[0], False, 4, 32), packed[s])
    cls, args = (AWQLinear, (32,)) if fmt == "awq" else (GPTQLinear, (4, 32))
    merged = load_merged(build_like_loader(cls, 128, SHARDS.total, False, *args, output_shards=SHARDS), packed)
    assert merged.kind == separate["q"].kind
    x = torch.randn(3, 128, generator=gen).bfloat16()
    assert_merged_equals_separate(merged, separate, x)


def test_merged_gptq_refuses_shards_with_different_g_idx():
    packed = {}
    for i, (s, ws) in enumerate(shard_weights(13).items()):
        qw = rtn_quantize(ws, 4, 32, sym=True, min_zero=1)
        if s == "v":
            qw.g_idx = torch.flip(qw.g_idx, [0])
        packed[s] = gptq_pack(qw, 1)
    merged = build_like_loader(GPTQLinear, 128, SHARDS.total, False, 4, 32, prefix="attn.qkv_proj",
                               output_shards=SHARDS)
    with pytest.raises(ModelLoadError, match=r"'v_proj\.g_idx' differs .*attn\.qkv_proj"):
        load_merged(merged, packed)


def test_merged_gptq_shard_shape_error_names_the_tensor():
    merged = build_like_loader(GPTQLinear, 128, SHARDS.total, False, 4, 32, prefix="attn.qkv_proj",
                               output_shards=SHARDS)
    wrong = gptq_pack(rtn_quantize(torch.randn(32, 128), 4, 32, True, min_zero=1), 1)  # k's size, given as q
    with pytest.raises(ModelLoadError, match=r"'q_proj\.qweight'.*\(16, 32\).*\(16, 64\).*bits and group_size"):
        merged.weight_loader("qweight", CheckpointTensor.in_memory("q_proj.qweight", wrong["qweight"]), "q")


@pytest.mark.parametrize("static", [False, True])
def test_merged_w8a8_equals_the_separate_ones(static):
    w = shard_weights(14)
    gen = torch.Generator().manual_seed(15)
    x = torch.randn(5, 128, generator=gen)
    scale = float(x.abs().max()) / 127 if static else None
    packed = {s: w8a8_pack(ws, scale) for s, ws in w.items()}
    separate = {s: fill(build_like_loader(W8A8Linear, 128, ws.shape[0], False, static=static), packed[s])
                for s, ws in w.items()}
    merged = load_merged(build_like_loader(W8A8Linear, 128, SHARDS.total, False, static=static,
                                           output_shards=SHARDS), packed)
    assert_merged_equals_separate(merged, separate, x.bfloat16())


def test_merged_w8a8_takes_the_largest_static_input_scale():
    w = shard_weights(16)
    packed = {s: w8a8_pack(ws, 0.01 * (i + 1)) for i, (s, ws) in enumerate(w.items())}
    merged = build_like_loader(W8A8Linear, 128, SHARDS.total, False, static=True, output_shards=SHARDS)
    for shard_id in ("k", "v", "q"):
        for name, t in packed[shard_id].items():
            merged.weight_loader(name, CheckpointTensor.in_memory(f"{shard_id}.{name}", t), shard_id)
    assert float(merged.input_scale) == pytest.approx(0.03)
