"""torch.ops.cinq.*: each native kernel's custom op passes torch's op checks (schema, declared mutations, fake
implementation against the real one) and gives what the direct extension call gives."""

from __future__ import annotations

import pytest
import torch

from cinq.kernels import custom_ops  # noqa: F401  (registers the ops)
from cinq.kernels.cpu_native import native_module

pytestmark = pytest.mark.skipif(any(native_module(n) is None for n in ("rms_norm", "rotary", "kv_write",
                                                                       "paged_decode", "small_m_gemm",
                                                                       "grouped_int_linear")),
                                reason="native CPU kernels unavailable on this machine")
bf16 = torch.bfloat16


def _cases() -> list[tuple[str, tuple]]:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(bf16)  # noqa: E731
    nb, bs, hkv, d = 4, 16, 2, 64
    cache = r(2, nb, bs, hkv, d)
    tables = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    table = torch.cat([torch.arange(64, dtype=torch.float32).outer(torch.ones(32)).cos(),
                       torch.arange(64, dtype=torch.float32).outer(torch.ones(32)).sin()], -1).to(bf16)
    return [
        ("rms_norm", (r(3, 128), r(3, 128), r(128), 1e-5)),
        ("rms_norm", (r(3, 128), torch.empty(0, dtype=bf16), r(128), 1e-5)),
        ("rotary_", (r(2, 6, d), r(2, hkv, d), torch.tensor([3, 17]), table)),
        ("write_kv", (r(2, hkv, d), r(2, hkv, d), cache.clone(), torch.tensor([5, 40]))),
        ("paged_decode", (r(2, 6, d), cache, tables, torch.tensor([20, 3], dtype=torch.int32), d ** -0.5, 1,
                          torch.empty(0, dtype=torch.bool))),
        ("small_m_linear", (r(3, 128), r(96, 128), torch.empty(0))),
        ("int4_affine_linear", (r(2, 64), torch.randint(0, 256, (5, 32), generator=g, dtype=torch.uint8),
                                torch.rand(5, 2, generator=g), torch.randn(5, 2, generator=g), 32)),
        ("int8_grouped_linear", (r(3, 64), torch.randint(-128, 128, (7, 64), generator=g, dtype=torch.int8),
                                 torch.rand(7, 1, generator=g), torch.empty(0), 64)),
        ("int4_affine_linear_i8", (r(2, 64), torch.randint(0, 256, (5, 32), generator=g, dtype=torch.uint8),
                                   torch.rand(5, 2, generator=g).half(), torch.empty(0, dtype=torch.half), 32, 8)),
        ("int8_grouped_linear_i8", (r(3, 64), torch.randint(-128, 128, (7, 64), generator=g, dtype=torch.int8),
                                    torch.rand(7, 1, generator=g), torch.empty(0), 64)),
    ]


CASES = len(_cases())
MODULES = {"rotary_": "rotary", "write_kv": "kv_write", "small_m_linear": "small_m_gemm",
           "int4_affine_linear": "grouped_int_linear", "int8_grouped_linear": "grouped_int_linear",
           "int4_affine_linear_i8": "int8_activation_linear", "int8_grouped_linear_i8": "int8_activation_linear"}


@pytest.mark.parametrize("i", range(CASES))
def test_opcheck(i):
    name, args = _cases()[i]
    torch.library.opcheck(getattr(torch.ops.cinq, name).default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("i", range(CASES))
def test_op_equals_the_direct_call(i):
    name, args = _cases()[i]
    module = MODULES.get(name, name)
    direct_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.inference_mode():
        got = getattr(torch.ops.cinq, name)(*args)
        want = getattr(native_module(module), name)(*direct_args)
    if got is None:  # in-place ops: compare what they mutated
        got, want = [a for a in args if isinstance(a, torch.Tensor)], [a for a in direct_args
                                                                      if isinstance(a, torch.Tensor)]
    for x, y in zip(got if isinstance(got, (list, tuple)) else [got], want if isinstance(want, (list, tuple))
                    else [want]):
        assert torch.equal(x, y)
