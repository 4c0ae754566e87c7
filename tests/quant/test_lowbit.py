"""2- and 3-bit weights: AutoGPTQ's packing (checked against an unpacker written here from its description, and
words computed by hand), bit-exact write/read round trips through a model folder (group sizes, act-order, sym
and asym, GPTQ v1 and v2), and serving: a 3-bit folder's logits against a dense model holding its dequantized
weights."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file

from cinq.errors import InvalidParameterError
from cinq.layers.quantization.format import QuantFormat
from cinq.layers.quantization.kernels import DEQUANTIZED_AT_LOAD
from cinq.layers.quantization.packing import gptq_pack, gptq_unpack, pack_along, unpack_along
from cinq.quant.config import QuantConfig
from cinq.quant.gptq import gptq_quantize
from cinq.quant.pipeline import check_shapes, quantize_model
from cinq.quant.rtn import rtn_quantize
from tests.quant.conftest import tiny_config


def autogptq_unpack_3bit(words: list[int]) -> list[int]:
    """AutoGPTQ's 3-bit rows, read back as its ``pack`` lays them out for 32 values in 3 words: word 0 holds
    values 0-9 at bits 3i and the low 2 bits of value 10 at bits 30-31; word 1 the high bit of value 10 at bit
    0, values 11-20 at bits 3i + 1 and the low bit of value 21 at bit 31; word 2 the high 2 bits of value 21 at
    bits 0-1 and values 22-31 at bits 3i + 2."""
    w0, w1, w2 = (w & 0xFFFFFFFF for w in words)
    out = [(w0 >> (3 * i)) & 7 for i in range(10)]
    out.append((w0 >> 30) | ((w1 & 1) << 2))
    out += [(w1 >> (3 * i + 1)) & 7 for i in range(10)]
    out.append((w1 >> 31) | ((w2 & 3) << 1))
    out += [(w2 >> (3 * i + 2)) & 7 for i in range(10)]
    return out


def test_3bit_words_by_hand():
    v = torch.zeros(32, 1, dtype=torch.int32)
    v[10] = 0b101  # straddles words 0 and 1: low bits 01 at bits 30-31 of word 0, high bit at bit 0 of word 1
    words = pack_along(v, 3, dim=0)
    assert words.shape == (3, 1) and [int(w) & 0xFFFFFFFF for w in words[:, 0]] == [1 << 30, 1, 0]
    v[:] = 0
    v[21] = 0b011  # straddles words 1 and 2: low bit at bit 31 of word 1, high bits 01 at bits 0-1 of word 2
    assert [int(w) & 0xFFFFFFFF for w in pack_along(v, 3, dim=0)[:, 0]] == [0, 1 << 31, 1]
    assert bool((pack_along(torch.full((32, 2), 7), 3, dim=0) == -1).all())  # every bit set


@pytest.mark.parametrize("dim", [0, 1])
def test_3bit_packing_matches_autogptq_layout_and_round_trips(dim):
    gen = torch.Generator().manual_seed(dim)
    v = torch.randint(0, 8, (64, 96), generator=gen, dtype=torch.int32)
    words = pack_along(v, 3, dim=dim)
    assert words.shape == ((6, 96) if dim == 0 else (64, 9)) and words.dtype == torch.int32
    assert torch.equal(unpack_along(words, 3, dim=dim), v)
    lines = words.movedim(dim, -1)
    vals = v.movedim(dim, -1)
    for r in range(0, lines.shape[0], 7):
        for unit in range(lines.shape[1] // 3):
            assert autogptq_unpack_3bit(lines[r, 3 * unit:3 * unit + 3].tolist()) == \
                vals[r, 32 * unit:32 * unit + 32].tolist()


def test_2bit_packing_is_16_values_per_word_lowest_bits_first():
    v = torch.tensor([[3, 0, 1, 2] + [0] * 12], dtype=torch.int32).t()  # 16 input channels, one output
    assert int(pack_along(v, 2, dim=0)[0, 0]) == 3 | (1 << 4) | (2 << 6)
    w = torch.randint(0, 4, (48, 32), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    assert torch.equal(unpack_along(pack_along(w, 2, dim=1), 2, dim=1), w)


@pytest.mark.parametrize("bits", [2, 3])
@pytest.mark.parametrize("group,sym,version,act", [(32, True, 1, False), (64, False, 2, False), (-1, False, 1, False),
                                                   (32, True, 2, True), (32, False, 1, True)])
def test_gptq_tensors_round_trip_bit_exact(bits, group, sym, version, act):
    gen = torch.Generator().manual_seed(bits * 10 + group)
    w = torch.randn(64, 128, generator=gen)
    min_zero = 1 if version == 1 else 0
    if act:
        x = torch.randn(256, 128, generator=gen) * torch.linspace(0.1, 3, 128)
        qw, _ = gptq_quantize(w, 2 * x.t() @ x / 256, bits, group, sym, desc_act=True, min_zero=min_zero)
        assert not qw.has_sequential_groups()
    else:
        qw = rtn_quantize(w, bits, group, sym, min_zero)
    assert int(qw.qweight.max()) < (1 << bits)
    t = gptq_pack(qw, version)
    assert t["qweight"].shape == (128 * bits // 32, 64) and t["qzeros"].shape == (qw.num_groups, 64 * bits // 32)
    back = gptq_unpack(t, bits, group, version)
    assert torch.equal(back.qweight.long(), qw.qweight.long()) and torch.equal(back.zeros.long(), qw.zeros.long())
    assert torch.equal(back.g_idx.long(), qw.g_idx.long())
    assert torch.equal(back.scales, qw.scales.half().float())


def test_grids_accept_2_and_3_bits_only_where_they_can_be_stored():
    assert QuantFormat("gptq", 3, 128).bits == 3 and QuantFormat.from_hf({"quant_method": "gptq", "bits": 2,
                                                                          "group_size": 64}).bits == 2
    for bad in (dict(method="gptq", bits=5), dict(method="awq", bits=3), dict(method="smoothquant", bits=4)):
        with pytest.raises(InvalidParameterError) as e:
            QuantConfig(**bad)
        assert e.value.param == "bits"
    narrow = tiny_config(hidden=48, inter=96, heads=3, kv_heads=3)  # 48 is no multiple of 32
    with pytest.raises(InvalidParameterError, match="multiples of 32"):
        check_shapes(narrow, QuantConfig("rtn", 3, -1))
    check_shapes(narrow, QuantConfig("rtn", 2, -1))  # 16 values per word: 48 packs


@pytest.mark.parametrize("method,bits,group,desc_act", [("rtn", 3, 32, False), ("gptq", 2, 32, True),
                                                        ("gptq", 3, -1, False)])
def test_folder_round_trip_is_bit_exact(trained_tiny, calib_tokens, tmp_path, method, bits, group, desc_act):
    out = tmp_path / "q"
    cfg = QuantConfig(method, bits, group, desc_act=desc_act)
    quantize_model(trained_tiny, out, cfg, None if method == "rtn" else calib_tokens, progress=False)
    tensors = load_file(str(out / "model.safetensors"))
    dense = load_file(str(trained_tiny / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj"
    qw = gptq_unpack({k: tensors[f"{name}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx")}, bits, group, 1)
    assert qw.bits == bits and int(qw.qweight.max()) < (1 << bits)
    if method == "rtn":  # RTN is deterministic: the file holds exactly the grid of the dense weight
        ref = rtn_quantize(dense[f"{name}.weight"].float(), bits, group, True, cfg.min_zero)
        assert torch.equal(qw.qweight.long(), ref.qweight.long()) and torch.equal(qw.scales, ref.scales.half().float())
    again = gptq_pack(qw, 1)
    for key in ("qweight", "qzeros", "scales", "g_idx"):
        assert torch.equal(again[key], tensors[f"{name}.{key}"]), key


def test_3bit_model_serves_its_dequantized_weights(trained_tiny, tmp_path, caplog):
    """The loaded 3-bit model (merged q/k/v and gate/up shards, 3-bit qzeros split across shards) computes what a
    dense model holding the file's dequantized weights computes."""
    from cinq.layers.quantization import kernels
    from cinq.model.loader import load_model
    out = tmp_path / "q3"
    quantize_model(trained_tiny, out, QuantConfig("rtn", 3, 32, sym=False), None, progress=False)
    tensors = load_file(str(out / "model.safetensors"))
    reference = load_model(trained_tiny, dtype="float32")
    with torch.no_grad():
        for name, module in reference.named_modules():
            shards = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
            leaf = name.rsplit(".", 1)[-1]
            if leaf not in ("qkv_proj", "gate_up_proj", "o_proj", "down_proj"):
                continue
            parent = name.rsplit(".", 1)[0]
            parts = [gptq_unpack({k: tensors[f"{parent}.{s}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx")},
                                 3, 32, 1).dequantize() for s in shards.get(leaf, (leaf,))]
            module.weight.copy_(torch.cat(parts))
    kernels._SAID.clear()
    with caplog.at_level(logging.WARNING, logger="cinq.layers.quantization.kernels"):
        served = load_model(out, dtype="float32")
    assert any("3-bit" in r.message and "dequantized" in r.message for r in caplog.records)
    kinds = {getattr(m, "kind", None) for m in served.modules()} - {None}
    assert kinds == {DEQUANTIZED_AT_LOAD}
    dense = load_model(trained_tiny, dtype="float32")
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a = served.compute_logits(served(ids))
        b = reference.compute_logits(reference(ids))
        c = dense.compute_logits(dense(ids))
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    assert (a - c).abs().max() > 1e-2  # the 3-bit grid did change the model
