"""The Triton NF4 dequant-GEMM (CUDA path of NF4Linear), run by the Triton interpreter on small shapes when there
is no GPU (tests/kernels/conftest.py sets TRITON_INTERPRET before the kernel is imported)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cinq.kernels.triton.nf4_gemm import nf4_gemm  # noqa: E402
from cinq.layers.quantization.nf4 import decode_nf4, nf4_quantize  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("m,n,k,blocksize,dq", [
    (1, 48, 64, 64, False),  # decode: one row
    (5, 40, 96, 64, True),  # N and K not multiples of the tiles; double-quantized absmax
    (3, 32, 128, 128, False),  # another block size
])
def test_matches_dequantized_reference(m, n, k, blocksize, dq, rel_err):
    gen = torch.Generator().manual_seed(m * 13 + n)
    w = decode_nf4(nf4_quantize(torch.randn(n, k, generator=gen), blocksize, dq), "w")
    x = torch.randn(m, k, generator=gen)
    t = [v.to(DEVICE) for v in (w.packed, w.absmax, w.levels)]
    y = nf4_gemm(x.to(DEVICE), *t, blocksize).cpu()
    assert rel_err(y, x @ w.dequantize().t()) < 1e-5
