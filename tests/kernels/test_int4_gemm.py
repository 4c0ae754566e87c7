"""The Triton dequant-GEMM (CUDA path of quantized linears), run by the Triton interpreter on small shapes
when there is no GPU (tests/kernels/conftest.py sets TRITON_INTERPRET before the kernel is imported)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cinq.kernels.triton.int4_gemm import triton_weight_only_mm  # noqa: E402
from cinq.layers.quantization.kernels import triton_tensors  # noqa: E402
from cinq.quant.rtn import rtn_quantize  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("bits,group,sym,m,n,k", [
    (4, 32, True, 1, 48, 64),  # decode: one row
    (4, 16, False, 5, 40, 96),  # N not a multiple of the tile
    (8, -1, False, 19, 64, 64),  # 8-bit, per channel, M over one tile
    (4, 48, True, 3, 32, 80),  # K not a multiple of the group (GPTQ's shorter last group)
])
def test_matches_dequantized_reference(bits, group, sym, m, n, k, rel_err):
    gen = torch.Generator().manual_seed(bits * 7 + m)
    qw = rtn_quantize(torch.randn(n, k, generator=gen), bits, group, sym)
    x = torch.randn(m, k, generator=gen)
    t = triton_tensors(qw, DEVICE)
    y = triton_weight_only_mm(x.to(DEVICE), t, bits).cpu()
    assert rel_err(y, x @ qw.dequantize().t()) < 1e-5


def test_act_order_g_idx_is_read_per_channel(rel_err):
    gen = torch.Generator().manual_seed(9)
    qw = rtn_quantize(torch.randn(32, 64, generator=gen), 4, 16, False)
    qw.g_idx = torch.argsort(torch.randperm(64, generator=gen)) // 16  # shuffled groups, as act-order writes
    qw.scales = qw.scales * (1 + torch.rand(qw.scales.shape, generator=gen))
    x = torch.randn(2, 64, generator=gen)
    y = triton_weight_only_mm(x.to(DEVICE), triton_tensors(qw, DEVICE), 4).cpu()
    assert rel_err(y, x @ qw.dequantize().t()) < 1e-5


def test_bf16_activations(rel_err):
    gen = torch.Generator().manual_seed(3)
    qw = rtn_quantize(torch.randn(64, 64, generator=gen), 4, 32, True)
    x = torch.randn(4, 64, generator=gen)
    y = triton_weight_only_mm(x.to(DEVICE, torch.bfloat16), triton_tensors(qw, DEVICE), 4)
    assert y.dtype == torch.bfloat16
    assert rel_err(y.float().cpu(), x @ qw.dequantize().t()) < 2e-2
