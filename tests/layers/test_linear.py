"""Linear layers: the dense one (whole and merged, through its weight loader) and the factory contract."""

from __future__ import annotations

import pytest
import torch

from cinq.errors import ModelLoadError
from cinq.layers.linear import DenseLinear, can_merge, make_linear
from cinq.layers.weight_loader import CheckpointTensor, OutputShards


def test_dense_linear_and_factory():
    lin = make_linear(8, 4, True)
    assert isinstance(lin, DenseLinear) and lin.weight.shape == (4, 8) and lin.bias.shape == (4,)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(4, 8))
        lin.bias.copy_(torch.randn(4))
    x = torch.randn(3, 8)
    assert torch.allclose(lin(x), x @ lin.weight.t() + lin.bias)

    class Factory:
        def quantizes(self, prefix):
            return prefix != "dense"

        def make_linear(self, i, o, b, prefix, compute_dtype, output_shards=None):
            return ("made", i, o, b, prefix)

    assert make_linear(8, 4, False, Factory(), "p") == ("made", 8, 4, False, "p")
    assert isinstance(make_linear(8, 4, False, Factory(), "dense"), DenseLinear)
    assert can_merge(None, ["a", "dense"]) and can_merge(Factory(), ["a", "b"])
    assert not can_merge(Factory(), ["a", "dense"])  # one quantized, one dense: kept apart


@pytest.mark.parametrize("rows", [1, 3, 4, 7])
def test_dense_bf16_decode_shapes_match_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    lin = DenseLinear(96, 40, True).bfloat16()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 96, generator=gen))
        lin.bias.copy_(torch.randn(40, generator=gen))
    x = torch.randn(rows, 96, generator=gen).bfloat16()
    ref = (x.float() @ lin.weight.float().t() + lin.bias.float()).detach()
    with torch.inference_mode():  # the path the engine takes (the native skinny kernel for <= 8 rows)
        y = lin(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 40)
    assert float((y.float() - ref).abs().max() / ref.abs().max()) < 1e-2
    assert lin(x).requires_grad  # with autograd on, plain F.linear keeps the graph




def test_merged_dense_linear_loads_each_shard_into_its_rows():
    shards = OutputShards(("q", "k", "v"), (4, 2, 2))
    lin = DenseLinear(8, 8, True, shards, prefix="attn.qkv_proj")
    parts = {s: torch.randn(n, 8) for s, n in zip(shards.ids, shards.sizes)}
    biases = {s: torch.randn(n) for s, n in zip(shards.ids, shards.sizes)}
    for s in ("v", "q", "k"):  # any order
        lin.weight_loader("weight", CheckpointTensor.in_memory(f"attn.{s}_proj.weight", parts[s]), s)
        lin.weight_loader("bias", CheckpointTensor.in_memory(f"attn.{s}_proj.bias", biases[s]), s)
    assert torch.equal(lin.weight.data, torch.cat([parts["q"], parts["k"], parts["v"]]))
    assert torch.equal(lin.bias.data, torch.cat([biases["q"], biases["k"], biases["v"]]))
    x = torch.randn(3, 8)
    y = lin(x)
    for s, (lo, hi) in {"q": (0, 4), "k": (4, 6), "v": (6, 8)}.items():
        assert torch.allclose(y[:, lo:hi], x @ parts[s].t() + biases[s], atol=1e-6)


def test_merged_dense_linear_names_the_tensor_on_a_wrong_shape_or_shard():
    lin = DenseLinear(8, 6, False, OutputShards((0, 1), (3, 3)), prefix="mlp.gate_up_proj")
    with pytest.raises(ModelLoadError, match=r"'mlp\.up_proj\.weight'.*\(4, 8\).*\(3, 8\)"):
        lin.weight_loader("weight", CheckpointTensor.in_memory("mlp.up_proj.weight", torch.zeros(4, 8)), 1)
    with pytest.raises(ModelLoadError, match=r"mlp\.gate_up_proj: no shard 2"):
        lin.weight_loader("weight", CheckpointTensor.in_memory("mlp.x.weight", torch.zeros(3, 8)), 2)
    with pytest.raises(ModelLoadError, match="must come with a shard id"):
        lin.weight_loader("weight", CheckpointTensor.in_memory("mlp.gate_up_proj.weight", torch.zeros(6, 8)))


@pytest.mark.parametrize("rows", [33, 63, 64, 200])
def test_dense_bf16_prefill_shapes_are_the_float32_product_rounded_once(rows, monkeypatch):
    """Past the decode sizes a bf16 DenseLinear computes in float32 and rounds once (the chunked skinny kernel
    below prefill_gemm.DENSE_MIN_ROWS rows, the float32 GEMM from there on CPUs whose bf16 GEMM is emulated)."""
    from cinq.kernels import prefill_gemm
    from cinq.layers import linear
    calls = []
    monkeypatch.setattr(linear, "dense_fp32_linear",
                        lambda *a: calls.append(a[0].shape) or prefill_gemm.dense_fp32_linear(*a))
    gen = torch.Generator().manual_seed(rows)
    lin = DenseLinear(96, 40, True).bfloat16()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 96, generator=gen))
        lin.bias.copy_(torch.randn(40, generator=gen))
    x = torch.randn(1, rows, 96, generator=gen).bfloat16()
    ref = (x.float() @ lin.weight.float().t() + lin.bias.float()).detach()
    with torch.inference_mode():
        y = lin(x)
    assert y.dtype == torch.bfloat16 and y.shape == (1, rows, 40)
    bound = ref.abs() * 2 ** -8 + 1e-5 * (x.float().abs() @ lin.weight.float().abs().t()).detach() + 1e-6
    assert ((y.float() - ref).abs() <= bound).all()
    assert calls == [(1, rows, 96)]  # past the decode sizes (32 rows at most) every call asks it first
