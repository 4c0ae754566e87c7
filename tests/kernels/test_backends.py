"""Every backend against the float64 reference on the serving step's shapes: decodes + chunked prefills +
whole prompts in one flat batch, scattered blocks, partially filled last blocks, GQA, odd head dims."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.backends import (
    available_backends,
    default_backend_name,
    get_backend,
    register_backend,
)
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.reference import paged_attention_reference
from cinq.kernels.triton import triton_available

CPU_BACKENDS = ["sdpa", "flash-torch", "reference"]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
HEADS = [(4, 4, 64), (8, 2, 80), (8, 1, 128), (16, 4, 128), (8, 8, 80), (16, 2, 64)]  # GQA ratios 1, 4, 8

# One step: 4 decodes (contexts 1..300), then chunks after a cached prefix (incl. a one-token chunk), then whole
# prompts (a one-token prompt, exactly one block, 300 tokens).
MIXED = ([1, 1, 1, 1, 5, 100, 1, 1, 16, 300], [1, 17, 300, 33, 40, 300, 16, 1, 16, 300])
# The same mix, small enough for the Triton interpreter.
MIXED_SMALL = ([1, 1, 1, 3, 1, 1, 20], [1, 17, 40, 20, 9, 1, 20])

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")


def _run(backend: str, case) -> torch.Tensor:
    out = torch.full_like(case.query, float("nan"))  # an element the backend forgets to write stays NaN
    got = get_backend(backend).forward(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale,
                                       out=out)
    assert got is out
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", HEADS)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_cpu_backends_match_reference(backend: str, hq: int, hkv: int, d: int, dtype: torch.dtype, paged_case,
                                      rel_err) -> None:
    case = paged_case(*MIXED, hq, hkv, d, dtype, seed=hq * 1000 + hkv * 100 + d)
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    assert rel_err(_run(backend, case), ref) <= TOL[dtype]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("query_lens,seq_lens", [
    ([1] * 6, [1, 2, 15, 16, 17, 300]),  # decodes only
    ([7, 1, 290], [7, 1, 290]),  # whole prompts only, no decode
    ([1], [1]),  # a single one-token prompt
    ([50, 3], [250, 19]),  # chunks after cached prefixes only
])
def test_cpu_backends_on_pure_steps(backend: str, query_lens: list[int], seq_lens: list[int], paged_case,
                                    rel_err) -> None:
    case = paged_case(query_lens, seq_lens, 8, 2, 64, seed=len(query_lens))
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    assert rel_err(_run(backend, case), ref) <= 1e-5


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 80), (8, 1, 128)])
def test_triton_backend_matches_reference(hq: int, hkv: int, d: int, dtype: torch.dtype, paged_case,
                                          rel_err) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = paged_case(*MIXED_SMALL, hq, hkv, d, dtype, seed=d, device=device)
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    assert rel_err(_run("triton", case), ref) <= TOL[dtype]


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", HEADS)
def test_triton_backend_matches_reference_full_mix(hq: int, hkv: int, d: int, dtype: torch.dtype, paged_case,
                                                   rel_err) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = paged_case(*MIXED, hq, hkv, d, dtype, seed=d + 1, device=device)
    ref, _ = paged_attention_reference(case.query, case.kv_cache, case.meta, case.scale)
    assert rel_err(_run("triton", case), ref) <= TOL[dtype]


@pytest.mark.parametrize("backend", available_backends())
def test_write_kv_stores_exactly_the_new_rows(backend: str) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"  # triton on CPU: interpreted (see conftest)
    cache = torch.full((2, 5, 4, 2, 16), float("nan"), device=device)
    key, value = torch.randn(3, 2, 16, device=device), torch.randn(3, 2, 16, device=device)
    slots = torch.tensor([17, 3, 8], device=device)
    get_backend(backend).write_kv(key, value, cache, slots)
    flat = cache.view(2, 20, 2, 16)
    assert torch.equal(flat[0, slots], key) and torch.equal(flat[1, slots], value)
    assert int(torch.isnan(flat).sum()) == 2 * 17 * 2 * 16  # nothing else written


@pytest.mark.parametrize("backend", available_backends())
def test_backends_reject_bad_inputs_with_clear_errors(backend: str) -> None:
    meta = AttentionMetadata.from_lens([1, 2], [5, 2], [[0, 2], [1]], block_size=4)
    cache, q, kv = torch.zeros(2, 3, 4, 2, 16), torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    impl = get_backend(backend)
    with pytest.raises(InvalidParameterError, match="head_dim"):
        impl.forward(torch.randn(3, 4, 8), kv, kv, cache, meta, 1.0)
    with pytest.raises(InvalidParameterError, match="multiple of kv heads"):
        impl.forward(torch.randn(3, 3, 16), kv, kv, cache, meta, 1.0)
    with pytest.raises(InvalidParameterError, match="dtype"):
        impl.forward(q.to(torch.int64), kv, kv, cache, meta, 1.0)
    with pytest.raises(InvalidParameterError, match="out"):
        impl.forward(q, kv, kv, cache, meta, 1.0, out=torch.empty(2, 4, 16))
    with pytest.raises(InvalidParameterError, match="tokens"):
        impl.forward(torch.randn(4, 4, 16), kv, kv, cache, meta, 1.0)


@needs_triton
def test_triton_backend_rejects_float64() -> None:
    meta = AttentionMetadata.from_lens([2], [2], [[0]], block_size=4)
    q, kv = torch.randn(2, 2, 16, dtype=torch.float64), torch.randn(2, 2, 16, dtype=torch.float64)
    with pytest.raises(InvalidParameterError, match="float16, bfloat16 or float32"):
        get_backend("triton").forward(q, kv, kv, torch.zeros(2, 1, 4, 2, 16, dtype=torch.float64), meta, 1.0)


def test_registry_names_and_defaults() -> None:
    names = available_backends()
    assert {"sdpa", "flash-torch", "reference"} <= set(names)
    assert ("triton" in names) == triton_available()
    assert default_backend_name("cpu") == "sdpa"
    assert default_backend_name("cuda") == ("triton" if triton_available() else "sdpa")
    for name in names:
        assert get_backend(name).name == name
    with pytest.raises(InvalidParameterError, match="choose one of") as err:
        get_backend("no-such-backend")
    assert err.value.param == "attention_backend"


def test_register_backend_makes_a_name_selectable() -> None:
    class Custom:
        name = "custom-test"

    register_backend("custom-test", Custom)
    try:
        assert "custom-test" in available_backends() and isinstance(get_backend("custom-test"), Custom)
    finally:
        from cinq.kernels import backends
        backends._REGISTRY.pop("custom-test")


def test_importing_backends_does_not_import_triton() -> None:
    code = "import sys, cinq.kernels.backends as b; b.available_backends(); print('triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
