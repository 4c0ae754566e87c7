"""cinq.kernels.prefill_gemm: prefill-sized linears through the float32 GEMM, the weight widened a block at a time."""

from __future__ import annotations

import pytest
import torch

from cinq.kernels import prefill_gemm
from cinq.kernels.cpu_native import bf16_gemm_is_emulated
from cinq.kernels.prefill_gemm import (
    DENSE_MIN_ROWS,
    bf16_block_linear,
    block_rows,
    dense_fp32_linear,
    dequant_linear,
    fp32_linear,
)


def one_rounding_bound(x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """How far one rounding to bf16 of a float32 sum (in any order) may sit from the float32 product ``ref``."""
    return ref.abs() * 2 ** -8 + 1e-5 * (x.float().abs() @ w.float().abs().t()) + 1e-6


@pytest.mark.parametrize("k", [1, 96, 768, 10 ** 6])
def test_block_rows_is_a_positive_multiple_of_16_within_the_block_bytes(k: int):
    rows = block_rows(k)
    assert rows >= 16 and rows % 16 == 0
    assert rows == 16 or rows * k * 4 <= prefill_gemm.BLOCK_BYTES


@pytest.mark.parametrize("rows_per_block", [16, 4096])  # several blocks, the last short; one block
def test_fp32_linear_is_the_float32_product_in_any_blocking(rows_per_block: int, monkeypatch):
    monkeypatch.setattr(prefill_gemm, "BLOCK_BYTES", 4 * 96 * rows_per_block)
    gen = torch.Generator().manual_seed(rows_per_block)
    x = torch.randn(33, 96, generator=gen).bfloat16()
    w = torch.randn(100, 96, generator=gen)
    b = torch.randn(100, generator=gen).bfloat16()
    asked = []

    def rows(n0: int, n1: int) -> torch.Tensor:
        asked.append((n0, n1))
        return w[n0:n1]

    y32 = fp32_linear(x, rows, 100, out_dtype=torch.float32)
    ref = x.float() @ w.t()
    assert y32.dtype == torch.float32 and torch.allclose(y32, ref, rtol=1e-5, atol=1e-5)
    assert asked[0][0] == 0 and asked[-1][1] == 100 and all(a[1] == b[0] for a, b in zip(asked, asked[1:]))
    assert len(asked) == (7 if rows_per_block == 16 else 1)
    y = fp32_linear(x, rows, 100, bias=b)  # x's dtype by default: bf16, rounded once after the bias
    ref_b = ref + b.float()
    assert y.dtype == torch.bfloat16 and ((y.float() - ref_b).abs() <= one_rounding_bound(x, w, ref_b)).all()


def test_fp32_linear_refuses_a_batched_input():
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        fp32_linear(torch.zeros(2, 3, 8), lambda a, b: torch.zeros(b - a, 8), 4)


@pytest.mark.parametrize("rows_per_block", [16, 4096])
def test_bf16_block_linear_is_the_product_of_the_bf16_rounded_weight(rows_per_block: int, monkeypatch):
    """Each block of the float32 weight rows is rounded once to bf16; the sums accumulate in float32 and the output
    rounds once to bf16 (the float32 weight itself would give a different product)."""
    monkeypatch.setattr(prefill_gemm, "BLOCK_BYTES", 4 * 96 * rows_per_block)
    gen = torch.Generator().manual_seed(rows_per_block + 1)
    x = torch.randn(33, 96, generator=gen).bfloat16()
    w = torch.randn(100, 96, generator=gen)
    asked = []

    def rows(n0: int, n1: int) -> torch.Tensor:
        asked.append((n0, n1))
        return w[n0:n1]

    y = bf16_block_linear(x, rows, 100)
    assert y.dtype == torch.bfloat16 and y.shape == (33, 100)
    assert len(asked) == (7 if rows_per_block == 16 else 1) and asked[-1][1] == 100
    wb = w.bfloat16().float()
    ref = x.float() @ wb.t()
    assert ((y.float() - ref).abs() <= one_rounding_bound(x, wb, ref)).all()
    assert not torch.equal(y, (x.float() @ w.t()).bfloat16())  # the weight was rounded, not kept in float32


def test_bf16_block_linear_refuses_float32_or_batched_inputs():
    with pytest.raises(ValueError, match="bf16"):
        bf16_block_linear(torch.zeros(3, 8), lambda a, b: torch.zeros(b - a, 8), 4)
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        bf16_block_linear(torch.zeros(2, 3, 8).bfloat16(), lambda a, b: torch.zeros(b - a, 8), 4)


@pytest.mark.parametrize("emulated", [True, False])
def test_dequant_linear_takes_the_bf16_gemm_only_where_the_cpu_has_bf16_instructions(emulated: bool, monkeypatch):
    monkeypatch.setattr(prefill_gemm, "bf16_gemm_is_emulated", lambda: emulated)
    calls = []
    for name in ("fp32_linear", "bf16_block_linear"):
        real = getattr(prefill_gemm, name)
        monkeypatch.setattr(prefill_gemm, name, lambda *a, _n=name, _r=real, **k: calls.append(_n) or _r(*a, **k))
    x = torch.randn(8, 32).bfloat16()
    w = torch.randn(16, 32)
    y = dequant_linear(x, lambda a, b: w[a:b], 16)
    assert calls == ["fp32_linear" if emulated else "bf16_block_linear"] and y.dtype == torch.bfloat16
    dequant_linear(x.float(), lambda a, b: w[a:b], 16)  # float32 activations: the float32 GEMM, whatever the CPU
    assert calls[-1] == "fp32_linear"


@pytest.mark.parametrize("shape", [(DENSE_MIN_ROWS, 96), (2, 50, 96)])
def test_dense_fp32_linear_is_the_float32_product_rounded_once(shape):
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=gen).bfloat16()
    w = torch.randn(40, 96, generator=gen).bfloat16()
    b = torch.randn(40, generator=gen).bfloat16()
    with torch.inference_mode():
        y = dense_fp32_linear(x, w, b)
    if not bf16_gemm_is_emulated():  # a CPU with bf16 instructions keeps torch's GEMM
        assert y is None
        return
    assert y is not None and y.shape == (*shape[:-1], 40) and y.dtype == torch.bfloat16
    ref = torch.nn.functional.linear(x.float(), w.float(), b.float()).reshape(-1, 40)
    assert ((y.float().reshape(-1, 40) - ref).abs() <= one_rounding_bound(x.reshape(-1, 96), w, ref)).all()


def test_dense_fp32_linear_leaves_other_inputs_to_the_caller():
    w = torch.randn(40, 96).bfloat16()
    x = torch.randn(DENSE_MIN_ROWS, 96).bfloat16()
    with torch.inference_mode():
        assert dense_fp32_linear(x[: DENSE_MIN_ROWS - 1], w, None) is None  # decode-sized: the native kernels
        assert dense_fp32_linear(x.float(), w, None) is None  # float32 activations: not a bf16 linear
    with torch.enable_grad():
        assert dense_fp32_linear(x, w, None) is None  # autograd: F.linear keeps the graph
