"""The int8-activation grouped linears (cinq/kernels/cpu/int8_activation_linear.cpp through
cinq.layers.quantization.int8_activations): against a float64 reference of the same quantized math (the kernel's own
int8 activations times the dequantized weights: equal within the bf16 rounding of the output), and against the exact
float32 product within the bound the int8 rounding of the activations allows."""

from __future__ import annotations

import pytest
import torch

from cinq.layers.quantization import int8_activations as i8
from cinq.layers.quantization import native

SHAPES = [(37, 1), (5, 3), (1001, 4)]  # (N, K / group); the last streams > 512 KB: split over the threads
ROWS = [1, 3, 9]


@pytest.fixture(scope="module")
def available() -> bool:
    if i8.i8_module() is None:
        pytest.skip("native int8-activation kernels unavailable here (no compiler or no AVX2 + FMA)")
    return True


def dequantized_x(x: torch.Tensor) -> torch.Tensor:
    """The activations as the kernel computes with them, float64."""
    q, s = i8.quantize_activations_i8(x)
    m, k = q.shape
    return (q.double().view(m, k // 32, 32) * s.double().unsqueeze(-1)).view(m, k)


def assert_same_math(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """Equal to (int8 x) @ W^T up to the float32 sums and the bf16 output rounding (2^-8 relative)."""
    ref = dequantized_x(x) @ w.double().t()
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    err = (got.double() - ref).abs()
    bound = 2 ** -8 * ref.abs() + 1e-5 * float(ref.abs().max())
    assert bool((err <= bound).all()), float((err - bound).max())


def weights4(n: int, k: int, group: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=gen) * 0.1 + 0.01
    mins = -8 * scales + torch.randn(n, k // group, generator=gen) * 0.05
    return codes, scales, mins


def test_activation_quantization_is_q8_0(available):
    """Codes round(x / s) in -127..127 with s = max |x| / 127 per block of 32: every value within s / 2."""
    x = (torch.randn(3, 256) * torch.logspace(-3, 2, 256)).bfloat16()
    q, s = i8.quantize_activations_i8(x)
    amax = x.float().view(3, 8, 32).abs().amax(-1)
    torch.testing.assert_close(s, amax / 127, rtol=1e-6, atol=0)
    assert int(q.abs().max()) == 127
    err = (dequantized_x(x) - x.double()).abs().view(3, 8, 32)
    assert bool((err <= s.double().unsqueeze(-1) / 2 * (1 + 1e-4)).all())  # ties: exactly s / 2, s rounded


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("n,groups", SHAPES)
@pytest.mark.parametrize("m", ROWS)
def test_int4_matches_the_quantized_math(available, threads, group, n, groups, m):
    gen = torch.Generator().manual_seed(group + n + 7 * m)
    k = group * groups
    codes, scales, mins = weights4(n, k, group, gen)
    t = native.pack_int4_affine(codes, scales, mins, group)
    x = torch.randn(m, k, generator=gen).bfloat16()
    assert_same_math(i8.int4_affine_linear_i8(x, t, group), x, native.dequantize_int4_affine(t, group))


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("m", [1, 4])
def test_int4_half_scales_with_offset(available, threads, group, m):
    """GGUF Q4_0's form: fp16 scales, no mins, W = d * (q - 8)."""
    gen = torch.Generator().manual_seed(group + m)
    n, k = 300, 4 * group
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    d = (torch.rand(n, k // group, generator=gen) * 0.1).half()
    t = native.pack_int4_affine(codes, d.float(), -8 * d.float(), group)
    t = {"codes": t["codes"], "scales": d}
    w = (codes.double() - 8) * d.double().repeat_interleave(group, 1)
    x = torch.randn(m, k, generator=gen).bfloat16()
    assert_same_math(i8.int4_affine_linear_i8(x, t, group, 8), x, w)


@pytest.mark.parametrize("half", [False, True], ids=["f32", "f16"])
@pytest.mark.parametrize("group", [32, 64, "K"])
@pytest.mark.parametrize("m", ROWS)
def test_int8_matches_the_quantized_math(available, threads, half, group, m):
    gen = torch.Generator().manual_seed(m + (3 if half else 0))
    n, k = 263, 192
    g = k if group == "K" else group
    codes = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    codes[0, :32] = -128  # the one code whose magnitude needs the unsigned read
    scales = torch.rand(n, k // g, generator=gen) * 0.01
    t = native.pack_int8_grouped(codes, scales, g)
    if half:
        t["scales"] = t["scales"].half()
    w = codes.double() * t["scales"].double().repeat_interleave(g, 1)
    x = torch.randn(m, k, generator=gen).bfloat16()
    x[0, :32] = -x[0, :32].abs()  # negative activations against -128
    assert_same_math(i8.int8_grouped_linear_i8(x, t, g), x, w)


GGUF_FORMS = ["q4_0", "q4_1", "q8_0", "int4 g64"]


def gguf_form(form: str, n: int, k: int, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], int, int,
                                                                        torch.Tensor]:
    """(kernel tensors, group, q_offset, dequantized weight float64) of one weight in the form the engine serves:
    GGUF's fp16 scales (Q4_0: W = d * (q - 8); Q4_1: d * q + m; Q8_0: d * q) or cinq's int4 g64 with float32 mins.
    Scales span 6 decades over the rows, so a row's result polluted by its neighbour's factors shows."""
    row_scale = torch.logspace(-4, 2, n).unsqueeze(1)
    group = 64 if form == "int4 g64" else 32
    d = torch.rand(n, k // group, generator=gen) * row_scale + 1e-6 * row_scale
    if form == "q8_0":
        codes = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
        t = native.pack_int8_grouped(codes, d, group)
        t["scales"] = t["scales"].half()
        return t, group, 0, codes.double() * t["scales"].double().repeat_interleave(group, 1)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    if form == "q4_0":
        t = {"codes": native.pack_int4_affine(codes, d, -8 * d, group)["codes"], "scales": d.half()}
        return t, group, 8, (codes.double() - 8) * d.half().double().repeat_interleave(group, 1)
    mins = torch.randn(n, k // group, generator=gen) * row_scale
    t = native.pack_int4_affine(codes, d, mins, group)
    if form == "q4_1":
        t["scales"], t["mins"] = t["scales"].half(), t["mins"].half()
        return t, group, 0, (codes.double() * t["scales"].double().repeat_interleave(group, 1)
                             + t["mins"].double().repeat_interleave(group, 1))
    return t, group, 0, native.dequantize_int4_affine(t, group).double()


@pytest.mark.parametrize("form", GGUF_FORMS)
# 2, 7, 11, 13 and 18 blocks of 32: never whole vectors of 8 blocks (the int4 kernel pairs block p with p + 4 of
# each 8, so a last vector of 5-7 blocks has pairs with both halves and pairs with one)
@pytest.mark.parametrize("k", [64, 224, 352, 416, 576])
def test_every_row_count_and_odd_shapes(available, threads, form, k):
    """1-9 activation rows (the decode and verify sizes, and one past the kernel's 8-row block) on N = 3001 outputs
    (odd; at K = 352 the call streams > 512 KB and splits over 2 threads), against the same quantized math."""
    if form == "int4 g64" and k % 64:
        pytest.skip("group 64 does not divide K")
    gen = torch.Generator().manual_seed(k + len(form))
    t, group, offset, w = gguf_form(form, 3001, k, gen)
    for m in range(1, 10):
        x = torch.randn(m, k, generator=gen).bfloat16()
        if form == "q8_0":
            got = i8.int8_grouped_linear_i8(x, t, group)
        else:
            got = i8.int4_affine_linear_i8(x, t, group, offset)
        assert_same_math(got, x, w)


def test_int8_activations_stay_within_their_rounding_of_the_exact_product(available):
    """Against x @ W^T with x exact: the error is sum_k W[n, k] * e[k] with |e[k]| <= s_b / 2, so
    |err| <= sum_b s_b / 2 * sum_{k in b} |W[n, k]| (+ bf16 output rounding). A kernel with int16-rounded or unrounded
    activations would pass too; one that dropped a block's scale or an offset would not (see the next test)."""
    gen = torch.Generator().manual_seed(5)
    n, k, group = 200, 256, 32
    codes, scales, mins = weights4(n, k, group, gen)
    t = native.pack_int4_affine(codes, scales, mins, group)
    w = native.dequantize_int4_affine(t, group).double()
    x = torch.randn(4, k, generator=gen).bfloat16()
    got = i8.int4_affine_linear_i8(x, t, group).double()
    ref = x.double() @ w.t()
    s = x.double().view(4, k // 32, 32).abs().amax(-1) / 127  # [M, B]
    wabs = w.abs().view(n, k // 32, 32).sum(-1)  # [N, B]
    bound = (s / 2) @ wabs.t() + 2 ** -8 * ref.abs() + 1e-6
    assert bool(((got - ref).abs() <= bound).all())
    assert float((got - ref).abs().max()) > 0  # and it is not the int16 path: the rounding shows


def test_a_broken_offset_fails_the_reference(available):
    """The same-math check catches a wrong offset term (the test above would not be vacuous)."""
    gen = torch.Generator().manual_seed(6)
    codes = torch.randint(0, 16, (64, 128), generator=gen, dtype=torch.uint8)
    d = (torch.rand(64, 4, generator=gen) * 0.1).half()
    x = torch.randn(2, 128, generator=gen).bfloat16()
    t = {"codes": native.pack_int4_affine(codes, d.float(), -8 * d.float(), 32)["codes"], "scales": d}
    w = (codes.double() - 8) * d.double().repeat_interleave(32, 1)
    assert_same_math(i8.int4_affine_linear_i8(x, t, 32, 8), x, w)
    with pytest.raises(AssertionError):
        assert_same_math(i8.int4_affine_linear_i8(x, t, 32, 0), x, w)  # wrong: 0 instead of 8


def test_knob_routes_the_native_linears(available, monkeypatch):
    """native.int4_affine_linear runs the int8-activation kernel with the knob on, the int16 one with it off."""
    gen = torch.Generator().manual_seed(8)
    codes, scales, mins = weights4(50, 128, 32, gen)
    t = native.pack_int4_affine(codes, scales, mins, 32)
    x = torch.randn(2, 128, generator=gen).bfloat16()
    try:
        i8.set_int8_activations(True)
        on = native.int4_affine_linear(x, t, 32)
        i8.set_int8_activations(False)
        off = native.int4_affine_linear(x, t, 32)
    finally:
        i8.set_int8_activations(None)
    assert torch.equal(on, i8.int4_affine_linear_i8(x, t, 32))
    assert torch.equal(off, native.grouped_module().int4_affine_linear(x, t["codes"], t["scales"], t["mins"], 32))
    assert not torch.equal(on, off)
    # group 64: the int8 kernel where it has AVX512-VNNI (faster there at every group), the int16 one on AVX2
    codes, scales, mins = weights4(50, 128, 64, gen)
    t = native.pack_int4_affine(codes, scales, mins, 64)
    i8.set_int8_activations(True)
    try:
        y64 = native.int4_affine_linear(x, t, 64)
        assert i8.uses_int8_activations(64, 4) == bool(i8.i8_module().has_vnni())
        assert not i8.uses_int8_activations(64, 8)  # 8-bit codes: group 32 only
    finally:
        i8.set_int8_activations(None)
    want = i8.int4_affine_linear_i8(x, t, 64) if i8.i8_module().has_vnni() else \
        native.grouped_module().int4_affine_linear(x, t["codes"], t["scales"], t["mins"], 64)
    assert torch.equal(y64, want)


def test_bad_knob_value_names_the_variable(monkeypatch):
    from cinq.errors import InvalidParameterError
    monkeypatch.setenv(i8.ENV, "yes")
    i8.set_int8_activations(None)
    try:
        with pytest.raises(InvalidParameterError, match=i8.ENV):
            i8.int8_activations()
    finally:
        monkeypatch.delenv(i8.ENV)
        i8.set_int8_activations(None)


@pytest.mark.parametrize("form", ["q4_0", "q4_1", "q8_0"])
def test_a_rows_result_does_not_depend_on_how_many_rows_share_the_call(available, form):
    # batch invariance: each row of a 12-row call (a chunk of 8, then 4) equals the same row called alone, bit for
    # bit, so speculative verify rows and batched decode reproduce batch-1 decode exactly
    from cinq.layers.quantization.gguf_blocks import BLOCK_BYTES
    from cinq.layers.quantization.gguf_linear import gguf_mm, i8_kernel_tensors
    gen = torch.Generator().manual_seed(3)
    n, k = 1024, 1536  # enough outputs that a different summation order flips some bf16 roundings
    size = BLOCK_BYTES[form.upper()]
    raw = torch.randint(0, 256, (n, k // 32, size), generator=gen, dtype=torch.uint8)
    raw[..., 0:2] = torch.tensor([0x00, 0x20], dtype=torch.uint8)
    if form == "q4_1":
        raw[..., 2:4] = torch.tensor([0x00, 0xA0], dtype=torch.uint8)
    t = i8_kernel_tensors(raw.reshape(n, -1), form.upper())
    kind = f"gguf_{form}_i8"
    x = torch.randn(12, k, generator=gen).bfloat16()
    y = gguf_mm(kind, t, 32, x)
    for m in range(12):
        assert torch.equal(gguf_mm(kind, t, 32, x[m:m + 1].contiguous()), y[m:m + 1]), m
    for m in (2, 5, 8):
        assert torch.equal(gguf_mm(kind, t, 32, x[:m].contiguous()), y[:m]), m


@pytest.mark.parametrize("form", GGUF_FORMS)
def test_out_writes_its_columns_of_a_wider_output_and_nothing_else(available, form):
    """The _out ops (the fused step's split linears) write into a column range of a wider output: bit-identical to
    the returning op, at 1 and several rows, and the other columns untouched."""
    gen = torch.Generator().manual_seed(3)
    t, group, offset, _ = gguf_form(form, 96, 576, gen)
    mod = i8.i8_module()
    mins = t.get("mins", torch.empty(0, dtype=t["scales"].dtype))
    for m in (1, 3, 9):
        x = torch.randn(m, 576, generator=gen).bfloat16()
        if form == "q8_0":
            want = mod.int8_grouped_linear_i8(x, t["codes"], t["scales"], mins, group)
        else:
            want = mod.int4_affine_linear_i8(x, t["codes"], t["scales"], mins, group, offset)
        wide = torch.full((m, 96 + 40), 7.0, dtype=torch.bfloat16)
        out = wide.narrow(1, 25, 96)
        if form == "q8_0":
            mod.int8_grouped_linear_i8_out(x, t["codes"], t["scales"], mins, group, out)
        else:
            mod.int4_affine_linear_i8_out(x, t["codes"], t["scales"], mins, group, offset, out)
        assert torch.equal(out, want)
        assert bool((wide[:, :25] == 7).all()) and bool((wide[:, 25 + 96:] == 7).all())
    with pytest.raises(RuntimeError, match="out bf16"):  # one column short
        if form == "q8_0":
            mod.int8_grouped_linear_i8_out(x, t["codes"], t["scales"], mins, group, torch.empty(m, 95).bfloat16())
        else:
            mod.int4_affine_linear_i8_out(x, t["codes"], t["scales"], mins, group, offset,
                                          torch.empty(m, 95).bfloat16())


@pytest.fixture(scope="module")
def avx2_build(available):
    """This kernel built as a CPU with AVX2 + FMA but no AVX-512 runs it (4-bit lanes through vpmaddubsw, Q8_0 rows
    without the lane order): code the suite's AVX-512 machines never execute otherwise (~40 s to build, cached)."""
    from cinq.kernels.cpu_native import module_from
    if not i8.i8_module().has_vnni():
        pytest.skip("this CPU has no AVX512-VNNI: its native build already is the AVX2 path")
    mod = module_from("int8_activation_linear", extra_cflags=("-mno-avx512f",))
    assert mod.has_fast_path() and not mod.has_vnni()
    return mod


@pytest.mark.parametrize("form", GGUF_FORMS)
def test_the_avx2_build_is_batch_invariant_and_computes_the_same_math(avx2_build, threads, form):
    """On an AVX2 CPU as here: every row of a call equals that row called alone, bit for bit, at the row counts the
    kernels special-case (1, the lane-order thresholds 2 and 3, a block of 8 and past it), and within the bf16
    rounding of the quantized math. (Against the AVX-512 build it may differ by one bf16 step in about 1 output of
    2,000: its float sums run in another order.)"""
    gen = torch.Generator().manual_seed(11 + len(form))
    for k in (224, 576):
        if form == "int4 g64" and k % 64:
            continue
        t, group, offset, w = gguf_form(form, 515, k, gen)
        mins = t.get("mins", torch.empty(0, dtype=t["scales"].dtype))

        def linear(x: torch.Tensor) -> torch.Tensor:
            if form == "q8_0":
                return avx2_build.int8_grouped_linear_i8(x, t["codes"], t["scales"], mins, group)
            return avx2_build.int4_affine_linear_i8(x, t["codes"], t["scales"], mins, group, offset)

        for m in (1, 2, 3, 5, 8, 11):
            x = (torch.randn(m, k, generator=gen) * 3).bfloat16()
            y = linear(x)
            assert_same_math(y, x, w)
            for r in range(m):
                assert torch.equal(linear(x[r:r + 1].contiguous()), y[r:r + 1]), (k, m, r)
