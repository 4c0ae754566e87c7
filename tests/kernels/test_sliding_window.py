"""Sliding-window attention (Gemma 3's local layers) in every backend: a row at position p sees keys > p - W.

The reference with a window is checked against plain causal attention over the truncated context (an
independent way to the same numbers); every backend is checked against the reference on mixed steps (decodes,
multi-row decodes, chunks after a cached prefix, whole prompts), with windows shorter and longer than the
contexts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cinq.kernels import sdpa as sdpa_module
from cinq.kernels.backends import get_backend
from cinq.kernels.paged import gather_context
from cinq.kernels.reference import attention_reference, paged_attention_reference
from cinq.kernels.triton import triton_available

MIXED = ([1, 1, 1, 5, 100, 1, 40, 300], [1, 40, 300, 60, 300, 1, 40, 300])
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _windowed(case, window):
    case.meta = dataclasses.replace(case.meta, sliding_window=window)
    return case


def test_reference_window_equals_attention_over_the_last_keys(paged_case) -> None:
    window = 24
    case = _windowed(paged_case([1, 1], [100, 10], 4, 2, 32), window)
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    for i, seq_len in enumerate(case.meta.seq_lens_cpu):
        k, v = gather_context(case.kv_cache, case.meta.block_tables[i], seq_len)
        lo = max(0, seq_len - window)
        want, _ = attention_reference(case.query[i:i + 1], k[lo:], v[lo:], case.scale, causal=True)
        torch.testing.assert_close(ref[i:i + 1], want, rtol=1e-12, atol=1e-12)


def test_window_changes_the_result(paged_case) -> None:
    case = paged_case([1], [200], 4, 2, 32)
    full, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    local, _ = paged_attention_reference(case.query, case.kv_cache, _windowed(case, 16).meta, case.scale)
    assert (full - local).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 16, 37, 512])
@pytest.mark.parametrize("backend", ["sdpa", "flash-torch"])
def test_cpu_backends_match_reference(backend: str, window: int, dtype: torch.dtype, paged_case, rel_err) -> None:
    case = _windowed(paged_case(*MIXED, 8, 2, 64, dtype, seed=window), window)
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    out = get_backend(backend).forward(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale)
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("ql", [1, 3])
def test_sdpa_decode_native_and_fallback(native: bool, ql: int, paged_case, rel_err, monkeypatch) -> None:
    if not native:  # the SDPA fallback the native kernel stands in for
        monkeypatch.setattr(sdpa_module, "paged_decode_native", lambda *a: None)
    case = _windowed(paged_case([ql] * 3, [ql, 50, 200], 8, 2, 64, decode_query_len=ql), 20)
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    out = sdpa_module.sdpa_paged_attention(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale)
    assert rel_err(out, ref) <= 1e-5


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("window", [4, 16])
def test_triton_matches_reference(window: int, paged_case, rel_err) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = _windowed(paged_case([1, 1, 3, 20], [1, 40, 20, 20], 4, 2, 32, device=device), window)
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    out = get_backend("triton").forward(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale)
    assert rel_err(out.cpu(), ref.cpu()) <= 1e-4
