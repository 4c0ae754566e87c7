"""bitsandbytes NF4: files written by transformers + bitsandbytes (``BitsAndBytesConfig(load_in_4bit=True)``,
``save_pretrained``) load with the values bitsandbytes dequantizes to, plain and double-quantized; what cinq
writes is what bitsandbytes reads (same dequantized values, the same codes it would choose); the native kernel
computes x W^T with those values; ``NF4Linear`` merges shards."""

from __future__ import annotations

import json

import pytest
import torch

from cinq.layers.quantization.nf4 import NF4_LEVELS, STATE_KEY, decode_nf4, dynamic_map, nf4_quantize
from cinq.layers.quantization.nf4_linear import NF4Linear
from cinq.layers.weight_loader import CheckpointTensor, OutputShards

bnb_f = pytest.importorskip("bitsandbytes.functional")


def _bnb(w: torch.Tensor, dq: bool, blocksize: int = 64) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """bitsandbytes' checkpoint tensors of W (suffixes after 'weight') and its dequantization."""
    q, state = bnb_f.quantize_4bit(w, blocksize=blocksize, quant_type="nf4", compress_statistics=dq)
    t = {"": q, **{"." + k: v for k, v in state.as_dict(packed=True).items()}}
    return t, bnb_f.dequantize_4bit(q, state)


def test_tables_equal_bitsandbytes():
    _, state = bnb_f.quantize_4bit(torch.randn(4, 64), blocksize=64, quant_type="nf4")
    assert torch.equal(NF4_LEVELS, state.code.float())
    assert torch.equal(dynamic_map(), bnb_f.create_dynamic_map(signed=True))


@pytest.mark.parametrize("dq", [False, True], ids=["plain", "double_quant"])
@pytest.mark.parametrize("blocksize", [64, 128])
def test_reads_bitsandbytes_tensors_and_writes_what_it_reads(dq, blocksize):
    gen = torch.Generator().manual_seed(blocksize + dq)
    w = (torch.randn(48, 256, generator=gen) * 0.05).to(torch.bfloat16)
    w[3, :64] = 0  # an all-zero block
    ref_t, ref = _bnb(w, dq, blocksize)
    mine = decode_nf4(ref_t, "w").dequantize(torch.float32)
    assert torch.equal(mine.to(torch.bfloat16), ref)  # bitsandbytes dequantizes to the weight's dtype
    ours = nf4_quantize(w, blocksize, dq)
    assert torch.equal(ours[""].reshape(-1), ref_t[""].reshape(-1))  # the codes bitsandbytes chooses
    if dq:  # bitsandbytes' 8-bit search is not always the nearest code: (nearly) all agree
        assert (ours[".absmax"] == ref_t[".absmax"]).float().mean() >= 0.95
        assert torch.equal(ours[".nested_absmax"], ref_t[".nested_absmax"])
    else:
        assert torch.equal(ours[".absmax"], ref_t[".absmax"])
    state = bnb_f.QuantState.from_dict({k[1:]: v for k, v in ours.items() if k}, torch.device("cpu"))
    assert torch.equal(bnb_f.dequantize_4bit(ours[""], state), decode_nf4(ours, "w").dequantize(torch.bfloat16))


def test_a_wrong_quant_state_is_named():
    t = nf4_quantize(torch.randn(8, 64), 64)
    t["." + STATE_KEY] = torch.tensor(list(json.dumps({"quant_type": "fp4", "blocksize": 64,
                                                       "shape": [8, 64]}).encode()), dtype=torch.uint8)
    with pytest.raises(Exception, match="quant_type 'fp4'"):
        decode_nf4(t, "layer")


def _load(layer: NF4Linear, prefix_tensors: dict[str | None, dict[str, torch.Tensor]]) -> None:
    names = {"": "weight", ".absmax": "weight__absmax", ".quant_map": "weight__quant_map",
             ".nested_absmax": "weight__nested_absmax", ".nested_quant_map": "weight__nested_quant_map",
             "." + STATE_KEY: "weight__quant_state"}
    for shard, t in prefix_tensors.items():
        for suffix, v in t.items():
            layer.weight_loader(names[suffix], CheckpointTensor.in_memory(f"x{suffix}", v), shard)
    layer.process_weights_after_loading()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_merged_layer_computes_with_each_shards_values(dtype):
    gen = torch.Generator().manual_seed(3)
    ws = {"q": torch.randn(64, 128, generator=gen), "k": torch.randn(32, 128, generator=gen) * 3}
    layer = NF4Linear(128, 96, False, True, "qkv", compute_dtype=dtype,
                      output_shards=OutputShards(("q", "k"), (64, 32)))
    _load(layer, {s: nf4_quantize(w, 64, True) for s, w in ws.items()})
    dense = torch.cat([decode_nf4(nf4_quantize(w, 64, True), s).dequantize() for s, w in ws.items()])
    x = torch.randn(3, 128, generator=gen)
    ref = x.to(dtype).float() @ dense.t()
    y = layer(x.to(dtype)).float()
    assert (y - ref).abs().max() <= 0.02 * ref.abs().max()
    if dtype == torch.bfloat16 and layer.kind != "dequantized_at_load":
        assert layer.kind == "nf4_native"
        y_many = layer(x.to(dtype).repeat(8, 1)).float()  # past the native rows: dequantized per call
        assert (y_many[:3] - ref).abs().max() <= 0.02 * ref.abs().max()


def test_native_kernel_against_the_dequantized_weight():
    from cinq.layers.quantization import native_float
    if not native_float.float_kernels_available():
        pytest.skip("native float-code kernels unavailable here")
    gen = torch.Generator().manual_seed(5)
    for n, k, bs, m in [(37, 64, 64, 1), (101, 256, 128, 5), (1001, 512, 64, 9)]:  # the last: > 512 KB, threads
        w = decode_nf4(nf4_quantize(torch.randn(n, k, generator=gen), bs, m % 2 == 1), "w")
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        y = native_float.nf4_linear(x, w.packed, w.absmax, w.levels, bs).float()
        ref = x.float() @ w.dequantize().t()
        assert (y - ref).abs().max() <= 2 ** -8 * ref.abs().max() + 1e-5, (n, k, bs, m)
