"""Kernel choice and results: CPU int4 / int8 kernels, their dequantize fallback, act-order permutation, W8A8."""

from __future__ import annotations

import logging

import pytest
import torch

from cinq.layers.quantization import kernels
from cinq.layers.quantization.kernels import _prepare_dequant, prepare_weight_only, w8a8_mm, weight_only_mm
from cinq.layers.quantization.qweight import QuantizedWeight
from cinq.quant.rtn import rtn_quantize
from cinq.quant.smoothquant import w8a8_fake_matmul

CPU = torch.device("cpu")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run(qw: QuantizedWeight, x: torch.Tensor, dtype=torch.bfloat16, force_dequant: bool = False):
    p = _prepare_dequant(qw, CPU, dtype) if force_dequant else prepare_weight_only(qw, CPU, dtype)
    return p.kind, weight_only_mm(p.kind, p.tensors, p.arg, x.to(dtype))


@pytest.fixture(params=["native", "aten"])
def int4_path(request, monkeypatch):
    """Run a test with cinq's native int4 kernel (skipped when it cannot be built) and with PyTorch's."""
    if request.param == "native":
        if kernels.int4_module() is None:
            pytest.skip("native int4 kernel unavailable (no compiler)")
    else:
        monkeypatch.setattr(kernels, "int4_module", lambda: None)
    return request.param


@pytest.fixture(params=["native", "aten"])
def int8_path(request, monkeypatch):
    """Run a test with cinq's native int8 kernel (skipped when it cannot be built) and with PyTorch's."""
    if request.param == "native":
        if kernels.int8_module() is None:
            pytest.skip("native int8 kernel unavailable (no compiler or no AVX2)")
    else:
        monkeypatch.setattr(kernels, "int8_module", lambda: None)
    return request.param


@pytest.mark.parametrize("group,sym", [(32, True), (64, False), (128, False), (-1, True), (256, False)])
def test_int4_kernels_match_reference_and_fallback(group, sym, int4_path):
    gen = torch.Generator().manual_seed(group)
    w = torch.randn(48, 256, generator=gen)
    qw = rtn_quantize(w, 4, group, sym)
    ref_w = qw.dequantize()
    for m in (1, 3, 9):  # one pass per row block of the native kernel, and a partial block
        x = torch.randn(m, 256, generator=gen)
        ref = x @ ref_w.t()
        kind, y = run(qw, x)
        native = int4_path == "native"  # every group here is a multiple of 32
        assert kind == ("int4_native" if native else "int4_cpu")
        kind_f, y_f = run(qw, x, force_dequant=True)
        assert kind_f.startswith("dequant")
        assert rel(y, ref) < 2e-2 and rel(y_f, ref) < 2e-2 and rel(y, y_f) < 2e-2


def test_native_int4_takes_any_out_features_and_act_order():
    if kernels.int4_module() is None:
        pytest.skip("native int4 kernel unavailable (no compiler)")
    gen = torch.Generator().manual_seed(5)
    qw = rtn_quantize(torch.randn(24, 512, generator=gen), 4, 128, False)  # N = 24: PyTorch's kernel refuses
    perm = torch.randperm(512, generator=gen)
    qw.g_idx = torch.argsort(perm) // 128
    qw.scales = qw.scales * (1 + torch.rand(qw.scales.shape, generator=gen))
    x = torch.randn(2, 512, generator=gen)
    kind, y = run(qw, x)
    assert kind == "int4_native"
    assert rel(y, x @ qw.dequantize().t()) < 2e-2


def test_int4_cpu_handles_act_order_by_permuting_k(monkeypatch):
    monkeypatch.setattr(kernels, "int4_module", lambda: None)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(32, 128, generator=gen)
    qw = rtn_quantize(w, 4, 32, False)
    perm = torch.randperm(128, generator=gen)
    qw.g_idx = (torch.argsort(perm) // 32)  # channel c belongs to group pos(c) // 32, as act-order writes it
    qw.scales = qw.scales * (1 + torch.rand(qw.scales.shape, generator=gen))
    x = torch.randn(3, 128, generator=gen)
    ref = x @ qw.dequantize().t()
    p = prepare_weight_only(qw, CPU, torch.bfloat16)
    assert p.kind == "int4_cpu" and "perm" in p.tensors
    assert rel(weight_only_mm(p.kind, p.tensors, p.arg, x.bfloat16()), ref) < 2e-2


def test_unsupported_shapes_fall_back_once_with_the_same_results(caplog, monkeypatch):
    monkeypatch.setattr(kernels, "int4_module", lambda: None)
    gen = torch.Generator().manual_seed(2)
    kernels._SAID.clear()
    qw = rtn_quantize(torch.randn(24, 128, generator=gen), 4, 32, False)  # N = 24: not a multiple of 16
    x = torch.randn(4, 128, generator=gen)
    with caplog.at_level(logging.WARNING, logger="cinq.layers.quantization.kernels"):
        kind, y = run(qw, x)
        run(qw, x)
    assert kind == "dequant_grouped"
    assert sum("out_features 24" in r.message for r in caplog.records) == 1
    assert rel(y, x @ qw.dequantize().t()) < 2e-2
    # GPTQ allows a last, shorter group (K = 80, G = 32): still exact math through the fallback.
    qw2 = rtn_quantize(torch.randn(32, 80, generator=gen), 4, 32, True)
    x2 = torch.randn(2, 80, generator=gen)
    kind2, y2 = run(qw2, x2, dtype=torch.float32)
    assert kind2 == "dequant_grouped" and rel(y2, x2 @ qw2.dequantize().t()) < 1e-5


@pytest.mark.parametrize("sym", [True, False])
def test_int8_cpu_kernel_with_and_without_zero_points(sym, int8_path):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(40, 96, generator=gen) + (0 if sym else 0.5)
    qw = rtn_quantize(w, 8, -1, sym)
    x = torch.randn(6, 96, generator=gen)
    kind, y = run(qw, x)
    assert kind == ("int8_native" if int8_path == "native" else "int8_cpu")
    assert rel(y, x @ qw.dequantize().t()) < 2e-2


@pytest.mark.parametrize("group,sym", [(32, True), (64, False)])
def test_native_int8_takes_groups(group, sym):
    if kernels.int8_module() is None:
        pytest.skip("native int8 kernel unavailable (no compiler or no AVX2)")
    gen = torch.Generator().manual_seed(group)
    qw = rtn_quantize(torch.randn(24, 192, generator=gen), 8, group, sym)  # grouped int8: aten has no kernel
    for m in (1, 5, 17):  # the kernel, and a prefill-sized call through the dequantized weight
        x = torch.randn(m, 192, generator=gen)
        kind, y = run(qw, x)
        assert kind == "int8_native" and rel(y, x @ qw.dequantize().t()) < 2e-2


@pytest.mark.parametrize("m", [3, 40])
def test_native_int4_prefill_rows_match(m):
    if kernels.int4_module() is None:
        pytest.skip("native int4 kernel unavailable (no compiler or no AVX2)")
    gen = torch.Generator().manual_seed(m)
    qw = rtn_quantize(torch.randn(40, 128, generator=gen), 4, 32, False)
    x = torch.randn(m, 128, generator=gen)
    kind, y = run(qw, x)
    assert kind == "int4_native" and rel(y, x @ qw.dequantize().t()) < 2e-2


def test_int8_kernel_refuses_k_not_multiple_of_16():
    # aten._weight_int8pack_mm returns garbage (or crashes) for such K on this CPU: never call it there.
    qw = rtn_quantize(torch.randn(16, 72), 8, -1, True)
    x = torch.randn(2, 72)
    kind, y = run(qw, x)
    assert kind == "dequant_grouped" and rel(y, x @ qw.dequantize().t()) < 2e-2


def test_fp32_activations_give_float_accuracy():
    qw = rtn_quantize(torch.randn(32, 64), 4, 32, True)
    x = torch.randn(3, 64)
    kind, y = run(qw, x, dtype=torch.float32)
    assert kind == "int4_cpu" and rel(y, x @ qw.dequantize().t()) < 1e-5


@pytest.mark.parametrize("static", [False, True])
def test_w8a8_int_gemm_matches_its_float_definition(static):
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(48, 64, generator=gen)
    x = torch.randn(2, 5, 64, generator=gen)
    from cinq.layers.quantization.packing import quantize_int8_per_channel
    q, s = quantize_int8_per_channel(w)
    scale = torch.tensor([float(x.abs().max()) / 127]) if static else None
    y = w8a8_mm(x, q.t().contiguous(), s, scale)
    ref = w8a8_fake_matmul(x.reshape(-1, 64), w, None if scale is None else float(scale)).reshape(2, 5, 48)
    assert y.shape == (2, 5, 48)
    assert rel(y, ref) < 1e-5
    assert rel(y, x @ w.t()) < 5e-2


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantized_at_load_block_serves_the_same_function_densely(bits):
    gen = torch.Generator().manual_seed(5)
    qw = rtn_quantize(torch.randn(32, 128, generator=gen), bits, -1 if bits == 8 else 32, True)
    x = torch.randn(5, 128, generator=gen)
    with kernels.dequantized_at_load():
        kind, y = run(qw, x, torch.float32)
    assert kind == kernels.DEQUANTIZED_AT_LOAD
    assert rel(y, x @ qw.dequantize().t()) < 1e-5
    assert run(qw, x, torch.bfloat16)[0] != kernels.DEQUANTIZED_AT_LOAD  # the block ended: kernels again


def _act_order(qw: QuantizedWeight, group: int, seed: int) -> QuantizedWeight:
    """``qw`` with its groups scattered over the input channels, as act-order files store them."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(qw.in_features, generator=gen)
    qw.g_idx = torch.argsort(perm) // group
    qw.scales = qw.scales * (1 + torch.rand(qw.scales.shape, generator=gen))
    return qw


def _gemm_weight(w: torch.Tensor) -> torch.Tensor:
    """The float32 weight a prefill GEMM multiplies: ``w`` where the bf16 GEMM is emulated (the float32 GEMM), else
    ``w`` rounded to bf16 (the bf16 GEMM, cinq.kernels.prefill_gemm)."""
    from cinq.kernels.cpu_native import bf16_gemm_is_emulated
    return w if bf16_gemm_is_emulated() else w.bfloat16().float()


def _float32_product_bound(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x @ W^T in float32, what one rounding to bf16 plus float32 summation order may move it by)."""
    ref = x.float() @ w.t()
    return ref, ref.abs() * 2 ** -8 + 1e-5 * (x.float().abs() @ w.abs().t()) + 1e-6


@pytest.fixture
def int16_activations():
    """The int16-activation kernels and their float32-GEMM crossover, whatever the CPU (with AVX512-VNNI every group
    would take the int8-activation kernel, up to its own rows)."""
    from cinq.layers.quantization import int8_activations as i8
    i8.set_int8_activations(False)
    yield
    i8.set_int8_activations(None)


@pytest.mark.parametrize("bits,group,act_order", [(4, 128, False), (4, 128, True), (4, 64, True), (8, -1, False),
                                                  (8, 64, False), (8, 64, True)])
def test_native_prefill_rows_are_a_gemm_of_the_dequantized_weight(bits, group, act_order,
                                                                               monkeypatch, int16_activations):
    """Past its kernel's rows (INT4_NATIVE_MAX_ROWS / NATIVE_MAX_ROWS) an int4 / int8 native layer dequantizes (a
    block of output rows at a time) and runs a GEMM: each output is the float32 product of the file's dequantized
    weight (where the bf16 GEMM is emulated; else of that weight rounded once to bf16), rounded once to bf16."""
    from cinq.kernels import prefill_gemm
    from cinq.layers.quantization import native
    if kernels.int4_module() is None:
        pytest.skip("native grouped kernels unavailable (no compiler or no AVX2)")
    monkeypatch.setattr(prefill_gemm, "BLOCK_BYTES", 4 * 256 * 16)  # 16 output rows per block: 3 blocks, one short
    calls = []
    real = native.dequant_linear
    monkeypatch.setattr(native, "dequant_linear", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    gen = torch.Generator().manual_seed(bits * group)
    qw = rtn_quantize(torch.randn(40, 256, generator=gen), bits, group, False)
    if act_order:
        qw = _act_order(qw, group, seed=7)
    w = qw.dequantize(torch.float32)
    most = native.INT4_NATIVE_MAX_ROWS if bits == 4 else native.NATIVE_MAX_ROWS  # the kernel's rows
    for m in (most, most + 1, 64):
        x = torch.randn(m, 256, generator=gen).bfloat16()
        kind, y = run(qw, x)
        assert kind == f"int{bits}_native" and y.dtype == torch.bfloat16 and y.shape == (m, 40)
        ref, bound = _float32_product_bound(x, w if m <= most else _gemm_weight(w))
        if m > most:
            assert calls[-1] == m  # the GEMM ran, not the kernel
            assert ((y.float() - ref).abs() <= bound).all()
        else:
            assert not calls and rel(y, ref) < 2e-2  # decode-sized: the kernel
    assert calls == [most + 1, 64]


@pytest.mark.parametrize("bits", [4, 8])
def test_prefill_chunks_give_the_rows_of_one_call(bits, int16_activations):
    """A prompt prefilled in chunks (the first at its kernel's most rows: the kernel; the others the kernel or the
    GEMM) gives each row what one call over every row (the GEMM) gives: the product to one bf16 rounding (the
    GEMM's on the bf16-rounded weight where the CPU has bf16 instructions), or the kernel's result for the first."""
    from cinq.layers.quantization import native
    if kernels.int4_module() is None:
        pytest.skip("native grouped kernels unavailable (no compiler or no AVX2)")
    gen = torch.Generator().manual_seed(11 + bits)
    qw = rtn_quantize(torch.randn(48, 256, generator=gen), bits, 128, False)
    x = torch.randn(70, 256, generator=gen).bfloat16()
    kind, whole = run(qw, x)
    cut = native.INT4_NATIVE_MAX_ROWS if bits == 4 else native.NATIVE_MAX_ROWS
    parts = torch.cat([run(qw, x[a:b])[1] for a, b in [(0, cut), (cut, cut + 20), (cut + 20, 70)]])
    assert kind == f"int{bits}_native" and parts.shape == whole.shape
    w = qw.dequantize(torch.float32)
    ref, bound = _float32_product_bound(x, _gemm_weight(w))  # 70 rows: the GEMM
    assert ((whole.float() - ref).abs() <= bound).all()
    # chunks of 20 and 18 (int4) or 20 and 34 rows (int8): int4's kernel on the exact weight, int8's GEMM
    ref, bound = _float32_product_bound(x, w if bits == 4 else _gemm_weight(w))
    assert ((parts[cut:].float() - ref[cut:]).abs() <= bound[cut:]).all()
    assert rel(parts[:cut], whole[:cut]) < 2e-2


def test_a_bf16_act_order_model_prefilled_in_chunks_or_at_once_scores_the_prompt_alike(tiny_llama, tmp_path):
    """The engine end to end: a bf16 GPTQ act-order model (bf16 activations: the int4 kernel, not the
    int8-activation one) scoring a 90-token prompt in chunks of 16 (the native kernel) or in one step (the
    float32 GEMM) gives the dequantized float32 model's prompt logprobs, to bf16's precision."""
    from cinq import LLM, SamplingParams
    from cinq.layers.quantization import int8_activations as i8
    from tests.layers.quantization.act_order import write_act_order_folders
    if kernels.int4_module() is None:
        pytest.skip("native grouped kernels unavailable (no compiler or no AVX2)")
    gptq, dequantized = write_act_order_folders(tiny_llama, tmp_path)
    prompt = [int(t) for t in torch.randint(10, 200, (90,), generator=torch.Generator().manual_seed(3))]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0, ignore_eos=True)

    def scores(folder, dtype: str, **engine) -> torch.Tensor:
        out = LLM(str(folder), dtype=dtype, num_kv_blocks=64, block_size=16, **engine).generate([prompt], params)[0]
        return torch.tensor([out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])

    ref = scores(dequantized, "float32")
    i8.set_int8_activations(False)
    try:
        chunked = scores(gptq, "bfloat16", max_num_batched_tokens=16)
        whole = scores(gptq, "bfloat16", max_num_batched_tokens=128)
    finally:
        i8.set_int8_activations(None)
    assert float((chunked - ref).abs().max()) < 0.1 and float((whole - ref).abs().max()) < 0.1
    assert float((chunked - whole).abs().max()) < 0.1
