"""RMSNorm: the native bf16 kernel (cinq/kernels/cpu/rms_norm.cpp) against the PyTorch path it replaces."""

from __future__ import annotations

import pytest
import torch

from cinq.kernels.cpu_native import native_module
from cinq.layers import norm as norm_mod
from cinq.layers.norm import RMSNorm


def _norm(hidden: int, seed: int) -> RMSNorm:
    n = RMSNorm(hidden, 1e-5).to(torch.bfloat16)
    n.weight.data.normal_(generator=torch.Generator().manual_seed(seed))
    return n


def test_native_kernel_builds_on_this_platform():
    assert native_module("rms_norm") is not None


def assert_native_matches_reference(norm: torch.nn.Module, x: torch.Tensor, res: torch.Tensor, monkeypatch,
                                    module: object, native: str) -> None:
    """``norm(x, res)`` and ``norm(x)`` with the native kernel, then with ``module.<native>`` patched to None (the
    PyTorch path): the residual sums equal (one bf16 rounding either way), the outputs within one bf16 step on a few
    values at most (the sum of squares may be summed in another order). Gemma's norm (tests/model/test_gemma3.py)
    is checked the same way."""
    with torch.inference_mode():
        y, s = norm(x, res)
        y0 = norm(x)
        monkeypatch.setattr(module, native, lambda *a: None)
        y_ref, s_ref = norm(x, res)
        y0_ref = norm(x)
    assert torch.equal(s, s_ref)
    for got, ref in ((y, y_ref), (y0, y0_ref)):
        assert got.dtype == torch.bfloat16 and got.shape == ref.shape
        assert torch.isclose(got.float(), ref.float(), rtol=2 ** -7, atol=0).all()
        assert (got != ref).float().mean() < 0.01


@pytest.mark.parametrize("shape", [(1, 384), (7, 96), (3, 5, 64), (300, 128)])
def test_native_matches_pytorch_path(shape, monkeypatch):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 4).to(torch.bfloat16)
    res = torch.randn(shape, generator=g).to(torch.bfloat16)
    assert_native_matches_reference(_norm(shape[-1], seed=len(shape)), x, res, monkeypatch, norm_mod,
                                    "rms_norm_native")


def test_inputs_are_not_modified_and_strided_input_works():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 256, generator=g).to(torch.bfloat16)
    x = base[:, :128]  # a strided view
    res = torch.randn(4, 128, generator=g).to(torch.bfloat16)
    x_before, res_before = x.clone(), res.clone()
    n = _norm(128, seed=1)
    with torch.inference_mode():
        y, s = n(x, res)
    assert torch.equal(x, x_before) and torch.equal(res, res_before)
    assert torch.equal(s, x + res)
    ref = (torch.nn.functional.rms_norm(s.float(), (128,), eps=1e-5).to(torch.bfloat16) * n.weight)
    assert torch.isclose(y.float(), ref.float(), rtol=2 ** -7, atol=0).all()


def test_autograd_and_float32_take_the_pytorch_path():
    n = RMSNorm(32, 1e-5)  # float32 weights
    x = torch.randn(2, 32, requires_grad=True)
    n(x).sum().backward()  # the native kernel has no backward: it must not have run
    assert x.grad is not None
    nb = _norm(32, seed=2)
    xb = torch.randn(2, 32).to(torch.bfloat16)
    y = nb(xb)  # bf16 with autograd on: PyTorch path, still correct
    ref = torch.nn.functional.rms_norm(xb.float(), (32,), eps=1e-5).to(torch.bfloat16) * nb.weight
    assert torch.equal(y, ref)
