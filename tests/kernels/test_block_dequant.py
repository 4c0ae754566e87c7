"""cinq/kernels/cpu/block_dequant.cpp: int4 / int8 weight blocks dequantized to bf16 in one pass, bit for bit what
the Python dequantization gives rounded to bf16: GGUF Q4_0 / Q4_1 / Q8_0 (the int8-activation kernels' tensors,
float16 scales) and the GPTQ / AWQ / RTN layers' packed tensors (float32 scales, any group, Q4_0-like q_offset);
and the weight rows that the prompt-sized GEMM is handed."""

from __future__ import annotations

import pytest
import torch

from cinq.layers.quantization import gguf_linear, native
from cinq.layers.quantization.gguf_linear import dequantize_i8_int4, dequantize_i8_int8, weight_rows

NO_MINS = torch.empty(0, dtype=torch.float16)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bf16 bits, but NaN only as NaN at the same places (its payload may differ)."""
    nan = a.isnan()
    return bool(torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16)))


@pytest.fixture(scope="module")
def mod():
    m = native.dequant_module()
    if m is None:
        pytest.skip("native kernels unavailable here (no compiler)")
    return m


def _tensors(n: int, k: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = {"codes": torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8),
         "scales": (torch.randn(n, k // 32, generator=g) * 0.02).half(),
         "mins": (torch.randn(n, k // 32, generator=g) * 0.05).half(),
         "codes8": torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)}
    t["scales"][0, 0] = float("nan")  # a broken file's NaN and inf scales stay NaN / inf, as torch's do
    t["scales"][1, -1] = float("inf")
    t["scales"][2, -1] = 6e-8  # a subnormal float16 scale: products near float32's and bf16's smallest values
    return t


@pytest.mark.parametrize("n,k", [(3, 32), (40, 96), (17, 576)])
def test_gguf_int4_blocks_equal_the_torch_dequantization_rounded_to_bf16(mod, n: int, k: int):
    t = _tensors(n, k, n * k)
    q41 = {"codes": t["codes"], "scales": t["scales"], "mins": t["mins"]}
    got = mod.dequantize_int4_bf16(t["codes"], t["scales"], t["mins"], 32, 0)
    ref = dequantize_i8_int4(q41, "gguf_q4_1_i8").bfloat16()
    assert got.dtype == torch.bfloat16 and got.shape == (n, k)
    assert same_bits(got, ref) and bool(got.isinf().any())  # inf scales stay inf (codes > 0)
    q40 = {"codes": t["codes"], "scales": t["scales"]}
    got = mod.dequantize_int4_bf16(t["codes"], t["scales"], NO_MINS, 32, 0)
    assert same_bits(got, dequantize_i8_int4(q40, "gguf_q4_0_i8").bfloat16())


@pytest.mark.parametrize("n,k", [(3, 32), (40, 96)])
def test_gguf_int8_blocks_equal_the_torch_dequantization_rounded_to_bf16(mod, n: int, k: int):
    t = _tensors(n, k, n + k)
    got = mod.dequantize_int8_bf16(t["codes8"], t["scales"], NO_MINS, 32)
    ref = dequantize_i8_int8({"codes": t["codes8"], "scales": t["scales"]}).bfloat16()
    assert same_bits(got, ref)


@pytest.mark.parametrize("group,n,k", [(32, 24, 256), (64, 24, 256), (128, 512, 4096)])
@pytest.mark.parametrize("q4_0_like", [False, True])
def test_packed_int4_layers_equal_native_dequantize_rounded_to_bf16(mod, group: int, n: int, k: int,
                                                                    q4_0_like: bool):
    """``pack_int4_affine``'s tensors (float32 scales and mins, q_offset 8 where min = -8 * scale throughout): the
    bits of ``native.dequantize_int4_affine`` rounded, both of its formulas. A float32 product or sum taken in
    another order differs by an ulp, which bf16 rounding hides but for values at a rounding boundary: the 2M-weight
    case meets enough of those to catch it (a kernel computing q * s - 8 * s for (q - 8) * s fails there)."""
    g = torch.Generator().manual_seed(group)
    scales = torch.rand(n, k // group, generator=g) * 0.05 + 1e-3
    mins = -8.0 * scales if q4_0_like else torch.randn(n, k // group, generator=g) * 0.1
    t = native.pack_int4_affine(torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8), scales, mins, group)
    assert int(t["q_offset"]) == (8 if q4_0_like else 0)
    got = mod.dequantize_int4_bf16(t["codes"], t["scales"], t["mins"], group, int(t["q_offset"]))
    assert same_bits(got, native.dequantize_int4_affine(t, group).bfloat16())


@pytest.mark.parametrize("group,with_mins", [(32, False), (64, True), (256, False)])
def test_packed_int8_layers_equal_native_dequantize_rounded_to_bf16(mod, group: int, with_mins: bool):
    g = torch.Generator().manual_seed(group + with_mins)
    n, k = 24, 256
    t = native.pack_int8_grouped(torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8),
                                 torch.rand(n, k // group, generator=g) * 0.01, group)
    if with_mins:
        t["mins"] = torch.randn(n, k // group, generator=g) * 0.1
    got = mod.dequantize_int8_bf16(t["codes"], t["scales"], t.get("mins", torch.empty(0)), group)
    assert same_bits(got, native.dequantize_int8_grouped(t, group).bfloat16())


def test_bad_tensors_are_refused_with_the_argument_named(mod):
    t = _tensors(4, 64, 1)
    with pytest.raises(RuntimeError, match="codes uint8"):
        mod.dequantize_int4_bf16(t["codes8"], t["scales"], NO_MINS, 32, 0)
    with pytest.raises(RuntimeError, match="scales float16 or float32"):
        mod.dequantize_int4_bf16(t["codes"], t["scales"].double(), NO_MINS, 32, 0)
    with pytest.raises(RuntimeError, match="mins empty"):
        mod.dequantize_int4_bf16(t["codes"], t["scales"], t["mins"][:, :1].contiguous(), 32, 0)
    with pytest.raises(RuntimeError, match="group a multiple of 32"):
        mod.dequantize_int4_bf16(t["codes"], t["scales"], NO_MINS, 48, 0)
    with pytest.raises(RuntimeError, match="q_offset needs the mins"):
        mod.dequantize_int4_bf16(t["codes"], t["scales"], NO_MINS, 32, 8)
    with pytest.raises(RuntimeError, match="codes int8"):
        mod.dequantize_int8_bf16(t["codes"], t["scales"], NO_MINS, 32)


@pytest.mark.parametrize("emulated", [True, False])
def test_weight_rows_are_native_bf16_only_where_the_bf16_gemm_is(mod, emulated: bool, monkeypatch):
    """Where the bf16 GEMM is emulated the float32 GEMM needs the exact float32 values; else the native bf16 rows,
    sliced to the rows asked for."""
    monkeypatch.setattr(native, "bf16_gemm_is_emulated", lambda: emulated)
    t = _tensors(40, 96, 5)
    q41 = {"codes": t["codes"], "scales": t["scales"], "mins": t["mins"]}
    q80 = {"codes": t["codes8"], "scales": t["scales"]}
    for tensors, kind, deq in [(q41, "gguf_q4_1_i8", lambda r: dequantize_i8_int4(r, "gguf_q4_1_i8")),
                               (q80, "gguf_q8_0_i8", dequantize_i8_int8)]:
        rows = weight_rows(tensors, kind)(8, 24)
        exact = deq(tensors)[8:24]
        assert rows.dtype == (torch.float32 if emulated else torch.bfloat16)
        assert same_bits(rows, exact.bfloat16()) if not emulated else torch.equal(rows, exact)
    assert (native.bf16_weight_rows(q41, 32, 4) is None) == emulated
    monkeypatch.setattr(native, "dequant_module", lambda: None)  # no build: torch's dequantization, any CPU
    assert native.bf16_weight_rows(q41, 32, 4) is None
    assert weight_rows(q41, "gguf_q4_1_i8")(0, 4).dtype == torch.float32
