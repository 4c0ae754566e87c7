"""benchmarks/prefill_ttft.py's arms route a GGUF layer's prompt-sized input the way they are named: ``before``
the int8-activation kernel below 512 rows and the float32 GEMM from there, the bf16 arms the bf16 GEMM from
``DEQUANT_ROWS``, on torch's or the native dequantization."""

from __future__ import annotations

import pytest
import torch

from cinq.kernels import prefill_gemm
from cinq.kernels.cpu_native import bf16_gemm_is_emulated
from cinq.layers.quantization import gguf_linear, native
from cinq.layers.quantization import int8_activations as i8


@pytest.fixture
def arms(monkeypatch):
    if bf16_gemm_is_emulated() or i8.i8_module() is None or native.dequant_module() is None:
        pytest.skip("needs bf16 instructions and the native kernels")
    for module, name in [(prefill_gemm, "bf16_gemm_is_emulated"), (native, "bf16_gemm_is_emulated"),
                         (native, "dequant_module"), (gguf_linear, "DEQUANT_ROWS")]:
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    from benchmarks import prefill_ttft
    return prefill_ttft


def _route(monkeypatch, rows: int) -> list[str]:
    """What ``gguf_mm`` of a Q4_1 layer ran for ``rows`` rows: the kernel, and which GEMM on which dequantization."""
    calls: list[str] = []
    for module, name in [(prefill_gemm, "fp32_linear"), (prefill_gemm, "bf16_block_linear"),
                         (gguf_linear, "int4_affine_linear_i8"), (gguf_linear, "dequantize_i8_int4")]:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _n=name, _r=real, **k: calls.append(_n) or _r(*a, **k))
    n, k = 64, 64
    g = torch.Generator().manual_seed(rows)
    t = {"codes": torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8),
         "scales": (torch.rand(n, k // 32, generator=g) * 0.01).half(),
         "mins": (torch.rand(n, k // 32, generator=g) * -0.01).half()}
    y = gguf_linear.gguf_mm("gguf_q4_1_i8", t, 32, torch.randn(rows, k, generator=g).bfloat16())
    assert y.shape == (rows, n)
    return sorted(set(calls))


def test_each_arm_runs_the_path_it_names(arms, monkeypatch):
    rows = gguf_linear.DEQUANT_ROWS
    assert rows < 512  # with bf16 instructions the GEMM starts before the old 512 rows
    arms.select("before")
    assert _route(monkeypatch, rows) == ["int4_affine_linear_i8"]
    assert _route(monkeypatch, 512) == ["dequantize_i8_int4", "fp32_linear"]
    arms.select("bf16 GEMM, torch dequant")
    assert _route(monkeypatch, rows) == ["bf16_block_linear", "dequantize_i8_int4"]
    arms.select("bf16 GEMM")
    assert _route(monkeypatch, rows) == ["bf16_block_linear"]  # the native pass, not torch's ops
    assert _route(monkeypatch, rows - 1) == ["int4_affine_linear_i8"]
    assert native.I8_DEQUANT_ROWS == rows
