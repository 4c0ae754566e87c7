"""Linear layers: the dense one, the factory contract, and the quantized kinds as the loader drives them
(built on the meta device under the model dtype, materialised, filled by checkpoint name, then repacked)."""

from __future__ import annotations

import pytest
import torch

from cinq.errors import ModelLoadError
from cinq.layers.linear import AWQLinear, DenseLinear, GPTQLinear, W8A8Linear, make_linear
from cinq.quant.formats import awq_pack, gptq_pack, w8a8_pack
from cinq.quant.rtn import rtn_quantize


def test_dense_linear_and_factory():
    lin = make_linear(8, 4, True)
    assert isinstance(lin, DenseLinear) and lin.weight.shape == (4, 8) and lin.bias.shape == (4,)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(4, 8))
        lin.bias.copy_(torch.randn(4))
    x = torch.randn(3, 8)
    assert torch.allclose(lin(x), x @ lin.weight.t() + lin.bias)

    class Factory:
        def make_linear(self, i, o, b, prefix):
            return ("made", i, o, b, prefix)
    assert make_linear(8, 4, False, Factory(), "p") == ("made", 8, 4, False, "p")


@pytest.mark.parametrize("rows", [1, 3, 4, 7])
def test_dense_bf16_decode_shapes_match_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    lin = DenseLinear(96, 40, True).bfloat16()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 96, generator=gen))
        lin.bias.copy_(torch.randn(40, generator=gen))
    x = torch.randn(rows, 96, generator=gen).bfloat16()
    ref = (x.float() @ lin.weight.float().t() + lin.bias.float()).detach()
    with torch.inference_mode():  # the path the engine takes (the native skinny kernel for <= 4 rows)
        y = lin(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 40)
    assert float((y.float() - ref).abs().max() / ref.abs().max()) < 1e-2
    assert lin(x).requires_grad  # with autograd on, plain F.linear keeps the graph


def build_like_loader(cls, *args, dtype=torch.bfloat16, **kwargs):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            module = cls(*args, **kwargs)
    finally:
        torch.set_default_dtype(old)
    return module.to_empty(device="cpu")


def fill(module, tensors):
    expected = dict(module.named_buffers())
    assert set(expected) == set(tensors), (set(expected), set(tensors))
    for name, t in tensors.items():
        assert expected[name].shape == t.shape and expected[name].dtype.is_floating_point == t.dtype.is_floating_point
        with torch.no_grad():
            expected[name].copy_(t)
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
    assert lin.kind in ("int4_native", "int4_cpu", "int8_cpu")
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


def test_quantized_linear_errors():
    with pytest.raises(ModelLoadError, match="q_proj: in_features 100"):
        GPTQLinear(100, 64, False, 4, 32, prefix="q_proj")
    with pytest.raises(ModelLoadError, match="group_size 48"):
        AWQLinear(128, 64, False, 48, prefix="o")
    lin = GPTQLinear(64, 32, False, 4, 32, prefix="model.layers.0.mlp.up_proj")
    with pytest.raises(RuntimeError, match="up_proj: process_weights_after_loading"):
        lin(torch.randn(1, 64))
