"""Rotary embedding: the native in-place bf16 kernel (cinq/kernels/cpu/rotary.cpp) is bit-identical to the
PyTorch path, including on the strided q / k views of a merged qkv projection."""

from __future__ import annotations

import pytest
import torch

from cinq.kernels.cpu_native import native_module
from cinq.layers import rotary as rotary_mod
from cinq.layers.rotary import RotaryEmbedding


def test_native_kernel_builds_on_this_platform():
    assert native_module("rotary") is not None


@pytest.mark.parametrize("tokens,hq,hkv,d", [(1, 6, 2, 64), (5, 4, 4, 32), (200, 8, 2, 128)])
@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 2.0}])
def test_native_matches_pytorch_path_in_place(tokens, hq, hkv, d, scaling, monkeypatch):
    g = torch.Generator().manual_seed(tokens + d)
    rope = RotaryEmbedding(d, 4096, 10000.0, scaling)
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=g).to(torch.bfloat16)
    positions = torch.randint(0, 4096, (tokens,), generator=g)
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(tokens, hq, d), k.view(tokens, hkv, d)  # strided views, as in the model
    with torch.inference_mode():
        monkeypatch.setattr(rotary_mod, "rotary_native", lambda *a: False)
        q_ref, k_ref = rope(positions, q.clone(), k.clone())
        monkeypatch.undo()
        before = qkv.clone()
        q_out, k_out = rope(positions, q, k)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()  # in place
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    assert torch.equal(qkv[:, (hq + hkv) * d:], before[:, (hq + hkv) * d:])  # v untouched


def test_out_of_table_position_raises_and_autograd_takes_the_pytorch_path():
    rope = RotaryEmbedding(16, 8, 10000.0, None)
    q = torch.randn(1, 2, 16).to(torch.bfloat16)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="outside the table"):
        rope(torch.tensor([8]), q.clone(), q.clone())
    qg = torch.randn(1, 2, 16, requires_grad=True)
    out, _ = rope(torch.tensor([3]), qg, qg)
    out.sum().backward()
    assert qg.grad is not None
