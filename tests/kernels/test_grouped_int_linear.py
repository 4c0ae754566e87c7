"""The native grouped-integer linears (cinq/kernels/cpu/grouped_int_linear.cpp through
cinq.layers.quantization.native): int4 affine (W = scale * q + min) and int8 grouped (W = scale * q), against a
float32 reference x @ W^T with W dequantized; every row count 1-9, odd N, groups 32 / 64 / 128 and per channel,
1 and 2 threads; and the dequantize helpers bit for bit against an independent float32 formula."""

from __future__ import annotations

import pytest
import torch

from cinq.layers.quantization import native

SHAPES = [(37, 1), (5, 3), (1, 2), (1001, 4)]  # (N, K / group); the last streams > 512 KB: split over the threads


@pytest.fixture(scope="module")
def available() -> bool:
    if not native.affine_kernels_available():
        pytest.skip("native grouped-integer kernels unavailable here (no compiler or no AVX2 + FMA)")
    return True


@pytest.fixture(autouse=True)
def int16_activations():
    """These are the int16-activation kernels' tests (the int8 ones: test_int8_activation_linear.py)."""
    from cinq.layers.quantization.int8_activations import set_int8_activations
    set_int8_activations(False)
    yield
    set_int8_activations(None)


def int4_weight(n: int, k: int, group: int, gen: torch.Generator):
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=gen) * 0.1 + 0.01
    mins = -8 * scales + torch.randn(n, k // group, generator=gen) * 0.05  # Q4_0-like, not exactly -8 scale
    return codes, scales, mins


def reference_w(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None, group: int) -> torch.Tensor:
    """W[n, k] = scale[n, k // group] * q[n, k] (+ min[n, k // group]), float32, one element at a time in spirit:
    scales expanded per channel, then one multiply and one add (as GGUF's reference dequantization rounds)."""
    s = scales.repeat_interleave(group, dim=1)
    w = s * codes.to(torch.float32)
    if mins is not None:
        w = w + mins.repeat_interleave(group, dim=1)
    return w


def assert_matches(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """Within bf16 output rounding of the float32 product (the kernel's int16 activations add ~2^-16)."""
    ref = x.float() @ w.t()
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    torch.testing.assert_close(got.float(), ref, rtol=2 ** -7, atol=2e-3 * float(ref.abs().max()))


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("n,groups", SHAPES)
def test_int4_affine_matches_float32(available, threads, group, n, groups):
    gen = torch.Generator().manual_seed(group * 7 + n + groups)
    k = group * groups
    codes, scales, mins = int4_weight(n, k, group, gen)
    t = native.pack_int4_affine(codes, scales, mins, group)
    w = reference_w(codes, scales, mins, group)
    for m in range(1, 10):
        x = torch.randn(m, k, generator=gen).bfloat16()
        assert_matches(native.int4_affine_linear(x, t, group), x, w)


@pytest.mark.parametrize("group", [32, 64, 128, "channel"])
@pytest.mark.parametrize("n,groups", SHAPES)
def test_int8_grouped_matches_float32(available, threads, group, n, groups):
    k = 64 * groups if group == "channel" else group * groups
    group = k if group == "channel" else group
    gen = torch.Generator().manual_seed(group * 5 + n + groups)
    codes = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, k // group, generator=gen) * 0.01 + 1e-3
    t = native.pack_int8_grouped(codes, scales, group)
    w = reference_w(codes, scales, None, group)
    for m in range(1, 10):
        x = torch.randn(m, k, generator=gen).bfloat16()
        assert_matches(native.int8_grouped_linear(x, t, group), x, w)


def test_int8_with_mins_and_leading_dims(available):
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(-128, 128, (9, 96), generator=gen, dtype=torch.int8)
    scales = torch.rand(9, 3, generator=gen) * 0.01
    t = native.pack_int8_grouped(codes, scales, 32)
    t["mins"] = torch.randn(9, 3, generator=gen) * 0.1
    x = torch.randn(2, 3, 96, generator=gen).bfloat16()
    y = native.int8_grouped_linear(x, t, 32)
    assert y.shape == (2, 3, 9)
    assert_matches(y.reshape(6, 9), x.reshape(6, 96), reference_w(codes, scales, t["mins"], 32))


@pytest.mark.parametrize("group", [32, 64, 128])
def test_dequantize_helpers_are_bit_exact(group):
    gen = torch.Generator().manual_seed(group)
    n, k = 13, group * 3
    codes, scales, mins = int4_weight(n, k, group, gen)
    t4 = native.pack_int4_affine(codes, scales, mins, group)
    assert torch.equal(native.unpack_int4_codes(t4["codes"]), codes)
    assert torch.equal(t4["scales"], scales) and torch.equal(t4["mins"], mins)  # float32 kept bit for bit
    assert torch.equal(native.dequantize_int4_affine(t4, group), reference_w(codes, scales, mins, group))
    c8 = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    t8 = native.pack_int8_grouped(c8, scales, group)
    assert torch.equal(native.dequantize_int8_grouped(t8, group), reference_w(c8, scales, None, group))
    t8k = native.pack_int8_grouped(c8, scales[:, :1], k)  # per channel
    assert torch.equal(native.dequantize_int8_grouped(t8k, k), reference_w(c8, scales[:, :1], None, k))


def test_q4_0_form_dequantizes_as_scale_times_q_minus_8():
    """GGUF Q4_0 / a symmetric GPTQ grid (min = -8 scale) dequantize as scale * (q - 8), one rounding: the value
    GGUF's reference gives, bit for bit (scale * q + min would round twice)."""
    gen = torch.Generator().manual_seed(4)
    codes = torch.randint(0, 16, (64, 96), generator=gen, dtype=torch.uint8)
    d = torch.rand(64, 3, generator=gen) * 0.37 + 1e-3  # full mantissas: s * q rounds
    t = native.pack_int4_affine(codes, d, -8 * d, 32)
    want = d.repeat_interleave(32, dim=1) * (codes.to(torch.float32) - 8)
    assert int(t["q_offset"]) == 8 and torch.equal(native.dequantize_int4_affine(t, 32), want)
    x = torch.randn(3, 96, generator=gen).bfloat16()
    assert_matches(native.int4_affine_linear(x, t, 32), x, want)


def test_int4_layout_is_ggufs_q4_block():
    """Per 32 channels 16 bytes, byte i = channel i (low nibble) | channel 16 + i (high nibble)."""
    codes = torch.arange(32, dtype=torch.uint8).remainder(16).reshape(1, 32)
    codes[0, 16:] = 15 - codes[0, 16:]
    t = native.pack_int4_affine(codes, torch.ones(1, 1), torch.zeros(1, 1), 32)
    expect = torch.tensor([(i & 15) | ((15 - (i & 15)) << 4) for i in range(16)], dtype=torch.uint8)
    assert torch.equal(t["codes"][0], expect)


def test_pack_rejects_bad_groups_and_codes():
    with pytest.raises(ValueError, match="multiple of 32"):
        native.pack_int4_affine(torch.zeros(2, 48, dtype=torch.uint8), torch.ones(2, 3), torch.ones(2, 3), 16)
    with pytest.raises(ValueError, match="0..15"):
        native.pack_int4_affine(torch.full((2, 32), 16, dtype=torch.uint8), torch.ones(2, 1), torch.ones(2, 1), 32)
    with pytest.raises(ValueError, match="scales"):
        native.pack_int8_grouped(torch.zeros(2, 64, dtype=torch.int8), torch.ones(2, 1), 32)


def test_without_the_native_module_the_results_hold(monkeypatch):
    gen = torch.Generator().manual_seed(9)
    codes, scales, mins = int4_weight(7, 64, 32, gen)
    t = native.pack_int4_affine(codes, scales, mins, 32)
    x = torch.randn(3, 64, generator=gen).bfloat16()
    monkeypatch.setattr(native, "grouped_module", lambda: None)
    assert not native.affine_kernels_available()
    assert_matches(native.int4_affine_linear(x, t, 32), x, reference_w(codes, scales, mins, 32))
    c8 = torch.randint(-128, 128, (7, 64), generator=gen, dtype=torch.int8)
    t8 = native.pack_int8_grouped(c8, scales, 32)
    assert_matches(native.int8_grouped_linear(x, t8, 32), x, reference_w(c8, scales, None, 32))
