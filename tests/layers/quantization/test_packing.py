"""GPTQ v1/v2, AWQ GEMM and W8A8 tensors: round trips, checked against straightforward unpackers written here
from the format descriptions (not from cinq's code), plus hand-computed words."""

from __future__ import annotations

import pytest
import torch

from cinq.errors import ModelLoadError
from cinq.layers.quantization.packing import (AWQ_ORDER, awq_pack, awq_unpack, gptq_pack, gptq_unpack, pack_along,
                                quantize_int8_per_channel, unpack_along, w8a8_pack)
from cinq.quant.rtn import rtn_quantize


def _word(v: int) -> int:
    return int(v) & 0xFFFFFFFF


def plain_gptq_unpack(qweight, qzeros, bits: int, version: int):
    """qweight [K*bits/32, N]: word r of column n holds input channels r*per .. r*per+per-1, lowest bits first.
    qzeros [G, N*bits/32]: same along N; v1 stores zero - 1."""
    per, mask = 32 // bits, (1 << bits) - 1
    rows, n = qweight.shape
    q = [[0] * n for _ in range(rows * per)]
    for r in range(rows):
        for c in range(n):
            w = _word(qweight[r, c])
            for j in range(per):
                q[r * per + j][c] = (w >> (bits * j)) & mask
    groups, cols = qzeros.shape
    z = [[0] * (cols * per) for _ in range(groups)]
    for g in range(groups):
        for c in range(cols):
            w = _word(qzeros[g, c])
            for j in range(per):
                z[g][c * per + j] = ((w >> (bits * j)) & mask) + (1 if version == 1 else 0)
    return torch.tensor(q), torch.tensor(z)


def plain_awq_unpack(qweight, qzeros):
    """qweight [K, N/8]: nibble i of word c holds output channel 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]

    def unpack(t):
        rows, cols = t.shape
        out = [[0] * (cols * 8) for _ in range(rows)]
        for r in range(rows):
            for c in range(cols):
                w = _word(t[r, c])
                for i in range(8):
                    out[r][c * 8 + order[i]] = (w >> (4 * i)) & 0xF
        return torch.tensor(out)
    return unpack(qweight), unpack(qzeros)


def test_gptq_word_layout_by_hand():
    # Input channels 0..7 of one output channel hold 1..8: the word reads 0x87654321 (lowest nibble first).
    q = torch.arange(1, 9, dtype=torch.int32).reshape(8, 1)
    assert _word(pack_along(q, 4, dim=0)[0, 0]) == 0x87654321
    # 8-bit: four channels per word.
    q8 = torch.tensor([[0x11], [0x22], [0x33], [0xF4]], dtype=torch.int32)
    assert _word(pack_along(q8, 8, dim=0)[0, 0]) == 0xF4332211


def test_awq_word_layout_by_hand():
    # Output channels 0..7 hold values 0..7: nibble i holds channel ORDER[i], i.e. value ORDER[i].
    q = torch.arange(8, dtype=torch.int32).reshape(1, 8)
    expected = sum(v << (4 * i) for i, v in enumerate([0, 2, 4, 6, 1, 3, 5, 7]))
    assert expected == 0x75316420
    assert _word(pack_along(q, 4, dim=1, order=AWQ_ORDER)[0, 0]) == expected


@pytest.mark.parametrize("bits,dim", [(4, 0), (4, 1), (8, 0), (8, 1)])
def test_pack_unpack_round_trip_all_values(bits, dim):
    gen = torch.Generator().manual_seed(bits + dim)
    v = torch.randint(0, 1 << bits, (32, 64), generator=gen, dtype=torch.int32)
    v[0, :] = (1 << bits) - 1  # top bit of the word set: the int32 is negative
    packed = pack_along(v, bits, dim=dim)
    assert packed.dtype == torch.int32 and bool((packed < 0).any())
    assert torch.equal(unpack_along(packed, bits, dim=dim), v)


@pytest.mark.parametrize("bits,group,sym,version", [(4, 32, True, 1), (4, 32, False, 1), (4, 16, False, 2),
                                                    (8, -1, True, 1), (8, 32, False, 2), (4, 48, False, 1)])
def test_gptq_pack_matches_independent_unpacker(bits, group, sym, version):
    gen = torch.Generator().manual_seed(bits * 100 + group)
    w = torch.randn(16, 96, generator=gen)
    qw = rtn_quantize(w, bits, group, sym, min_zero=1 if version == 1 else 0)
    t = gptq_pack(qw, version)
    per = 32 // bits
    groups = -(-96 // (96 if group < 0 else group))
    assert t["qweight"].shape == (96 // per, 16) and t["qweight"].dtype == torch.int32
    assert t["qzeros"].shape == (groups, 16 // per) and t["qzeros"].dtype == torch.int32
    assert t["scales"].shape == (groups, 16) and t["scales"].dtype == torch.float16
    assert t["g_idx"].shape == (96,) and t["g_idx"].dtype == torch.int32
    q_plain, z_plain = plain_gptq_unpack(t["qweight"], t["qzeros"], bits, version)
    assert torch.equal(q_plain.t(), qw.qweight.long())
    assert torch.equal(z_plain, qw.zeros.long())
    if sym:
        assert bool((z_plain == (1 << (bits - 1))).all())  # the symmetric zero 8 (4-bit) / 128 (8-bit)
    # Dequantize exactly as AutoGPTQ does: scale[g_idx[k]] * (q - zero[g_idx[k]]).
    g = t["g_idx"].long()
    w_plain = t["scales"].float()[g].t() * (q_plain.t().float() - z_plain.float()[g].t())
    back = gptq_unpack(t, bits, group, version)
    assert torch.allclose(back.dequantize(), w_plain, atol=0, rtol=0)
    assert torch.equal(back.qweight.long(), qw.qweight.long()) and torch.equal(back.g_idx, qw.g_idx.long())


def test_gptq_v1_cannot_store_zero_point_zero_but_v2_can():
    w = torch.rand(8, 32) + 0.1  # all positive: the asymmetric zero point is 0
    qw = rtn_quantize(w, 4, 32, sym=False)
    assert int(qw.zeros.min()) == 0
    with pytest.raises(ValueError, match="zero point of 0"):
        gptq_pack(qw, 1)
    t = gptq_pack(qw, 2)
    _, z = plain_gptq_unpack(t["qweight"], t["qzeros"], 4, version=2)
    assert torch.equal(z, qw.zeros.long())
    # With min_zero=1 the v1 file holds it, and the stored nibble is zero - 1.
    qw1 = rtn_quantize(w, 4, 32, sym=False, min_zero=1)
    t1 = gptq_pack(qw1, 1)
    assert (_word(t1["qzeros"][0, 0]) & 0xF) == int(qw1.zeros[0, 0]) - 1


@pytest.mark.parametrize("group,sym", [(32, False), (64, True), (-1, False)])
def test_awq_pack_matches_independent_unpacker(group, sym):
    gen = torch.Generator().manual_seed(group + 3)
    w = torch.randn(24, 64, generator=gen)
    qw = rtn_quantize(w, 4, group, sym)
    t = awq_pack(qw)
    groups = 64 // (64 if group < 0 else group)
    assert t["qweight"].shape == (64, 3) and t["qzeros"].shape == (groups, 3) and t["scales"].shape == (groups, 24)
    q_plain, z_plain = plain_awq_unpack(t["qweight"], t["qzeros"])
    assert torch.equal(q_plain, qw.qweight.long().t())  # AWQ qweight is [K, N]
    assert torch.equal(z_plain, qw.zeros.long())  # no -1 in AWQ
    back = awq_unpack(t, group)
    assert torch.equal(back.qweight, qw.qweight) and torch.equal(back.zeros, qw.zeros)


def test_awq_rejects_act_order_and_8_bits():
    qw = rtn_quantize(torch.randn(8, 64), 4, 32)
    qw.g_idx = qw.g_idx.flip(0)
    with pytest.raises(ValueError, match="g_idx"):
        awq_pack(qw)
    with pytest.raises(ValueError, match="4-bit"):
        awq_pack(rtn_quantize(torch.randn(8, 64), 8, 32))


def test_gptq_unpack_names_the_tensor_on_inconsistent_g_idx():
    qw = rtn_quantize(torch.randn(8, 64), 4, 32)
    t = gptq_pack(qw, 1)
    t["g_idx"] = torch.full((64,), 5, dtype=torch.int32)  # only 2 groups exist
    with pytest.raises(ModelLoadError, match=r"layer\.q_proj\.g_idx"):
        gptq_unpack(t, 4, 32, 1, name="layer.q_proj")


def test_w8a8_pack_is_symmetric_per_channel():
    w = torch.randn(6, 40)
    w[2] *= 100  # one big row must not change the others' scales
    t = w8a8_pack(w, input_scale=0.5)
    q, s = t["weight"], t["weight_scale"]
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and t["input_scale"].shape == (1,)
    assert int(q.abs().max()) == 127 and bool((q.abs().amax(1) == 127).all())
    assert torch.allclose(s, w.abs().amax(1) / 127)
    assert ((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-6).all()
    q2, _ = quantize_int8_per_channel(w)
    assert torch.equal(q2, q)
    assert "input_scale" not in w8a8_pack(w, None)
