"""The native skinny bf16 GEMM (cinq/kernels/cpu/small_m_gemm.cpp): every row count it takes, both of its paths
(AVX512-BF16 vector tiles; AMX tiles where the CPU has them), shapes off its tile sizes (K not a multiple of 32,
N not a multiple of 16), with and without bias, against a float32 reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cinq.kernels.cpu_native import SMALL_M_MAX_ROWS, native_module, small_m_linear_native, small_m_rows

PATHS = {"auto": 0, "vector": 1, "amx": 2}
SHAPES = [  # (N, K)
    (40, 72),  # N % 16 = 8, K % 32 = 8
    (37, 385),  # odd K: AMX packs x by pairs, the last pair half padding
    (15, 64),  # N below one AMX block: vector tiles only
    (16, 31),  # one AMX block exactly, K below one k-step
    (1, 33),  # a single output
    (200, 700),  # 280 KB of weight: split over the threads; N % 16 = 8, K % 32 = 28
]


@pytest.fixture(scope="module")
def kernel():
    mod = native_module("small_m_gemm")
    if mod is None:
        pytest.skip("native small-M kernel unavailable on this machine (no compiler or no AVX512-BF16)")
    return mod


def assert_matches_float32(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    """Within bf16 output rounding of the float32 product of the same (bf16) inputs."""
    ref = F.linear(x.float(), w.float(), b)
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    torch.testing.assert_close(got.float(), ref, rtol=2 ** -7, atol=1e-3 * float(ref.abs().max()))


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("rows", range(1, SMALL_M_MAX_ROWS + 1))
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_matches_float32_reference(kernel, path, rows, n, k, bias):
    if path == "amx" and not kernel.has_amx():
        pytest.skip("no AMX on this CPU (or the OS refused it)")
    g = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g) if bias else None
    got = kernel.small_m_linear(x, w, b if b is not None else torch.empty(0), PATHS[path])
    assert_matches_float32(got, x, w, b)


def test_kernel_rejects_more_rows_than_it_has(kernel):
    w = torch.randn(16, 32).bfloat16()
    assert kernel.max_rows() == SMALL_M_MAX_ROWS
    with pytest.raises(RuntimeError):
        kernel.small_m_linear(torch.randn(SMALL_M_MAX_ROWS + 1, 32).bfloat16(), w, torch.empty(0))


def test_row_cutoff_follows_the_cpu(kernel):
    # With AMX every row count the kernel takes beats oneDNN; the vector path alone stops earlier.
    assert small_m_rows() == (SMALL_M_MAX_ROWS if kernel.has_amx() else min(SMALL_M_MAX_ROWS, kernel.fast_rows()))
    assert 4 <= small_m_rows() <= SMALL_M_MAX_ROWS  # never fewer rows than before the AMX path


@pytest.mark.parametrize("rows", range(1, SMALL_M_MAX_ROWS + 2))
def test_linear_entry_point_takes_rows_up_to_the_cutoff(kernel, rows):
    # [1, rows, K], as a verify step's hidden states reach a linear: flattened to rows, reshaped back
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 72, generator=g).bfloat16()
    w = torch.randn(40, 72, generator=g).bfloat16()
    b = torch.randn(40, generator=g).bfloat16()  # a bf16 model's bias: the entry point hands the kernel float32
    with torch.no_grad():
        got = small_m_linear_native(x, w, b)
    if rows > small_m_rows():
        assert got is None  # oneDNN's turn
        return
    assert got is not None and got.shape == (1, rows, 40)
    assert_matches_float32(got[0], x[0], w, b.float())


def test_amx_path_and_onednn_amx_interleave(kernel):
    # Tile configuration is per thread and oneDNN's bf16 matmuls use AMX too: each side must configure its own
    # tiles (and the kernel release them), whatever ran before it on the thread.
    if not kernel.has_amx():
        pytest.skip("no AMX on this CPU (or the OS refused it)")
    g = torch.Generator().manual_seed(7)
    w = torch.randn(1000, 384, generator=g).bfloat16()
    for m_big in (16, 32, 100):
        xb = torch.randn(m_big, 384, generator=g).bfloat16()
        xs = torch.randn(5, 384, generator=g).bfloat16()
        assert_matches_float32(F.linear(xb, w), xb, w, None)
        assert_matches_float32(kernel.small_m_linear(xs, w, torch.empty(0), PATHS["amx"]), xs, w, None)


def test_a_rows_result_does_not_depend_on_how_many_rows_share_the_call() -> None:
    # a sequence must decode the same tokens alone, beside others, or as a k + 1-row speculative verify
    mod = native_module("small_m_gemm")
    if mod is None or not mod.has_fast_path():
        pytest.skip("the native kernel is not built on this CPU")
    # 4,096 outputs of 1,536 channels: a change in a row's float32 summation order (one accumulation chain instead
    # of two, say) flips the bf16 rounding of some dozens of them; on a small weight it could go unseen
    g = torch.Generator().manual_seed(5)
    w = torch.randn(4096, 1536, generator=g).bfloat16()
    x = torch.randn(SMALL_M_MAX_ROWS, 1536, generator=g).bfloat16()
    alone = [mod.small_m_linear(x[i:i + 1].contiguous(), w, torch.empty(0), 0)[0] for i in range(SMALL_M_MAX_ROWS)]
    for m in range(2, SMALL_M_MAX_ROWS + 1):  # past 8 rows the kernel runs passes of 8 over each block of outputs
        y = mod.small_m_linear(x[:m].contiguous(), w, torch.empty(0), 0)
        assert all(torch.equal(y[i], alone[i]) for i in range(m)), m


@pytest.fixture(scope="module")
def avx2_kernel(kernel):
    """This kernel built as a CPU with AVX2 + FMA but no AVX-512 runs it (AMD Zen 3, say): the suite's AVX512-BF16
    machines never execute its AVX2 tiles otherwise (~40 s to build, cached)."""
    from cinq.kernels.cpu_native import module_from
    mod = module_from("small_m_gemm", extra_cflags=("-mno-avx512f",))
    assert mod.has_fast_path() and not mod.has_amx()
    return mod


def test_the_avx2_builds_rows_do_not_depend_on_how_many_rows_share_the_call(avx2_kernel):
    # as the native test below, on the AVX2 build: the small SHAPES never showed the AVX2 path summing a row in one
    # chain from 5 rows and in two below (found only when the suite ran on a Zen 3); this weight shows it
    g = torch.Generator().manual_seed(5)
    w = torch.randn(4096, 1536, generator=g).bfloat16()
    x = torch.randn(8, 1536, generator=g).bfloat16()
    alone = [avx2_kernel.small_m_linear(x[i:i + 1].contiguous(), w, torch.empty(0), 0)[0] for i in range(8)]
    for m in range(2, 9):
        y = avx2_kernel.small_m_linear(x[:m].contiguous(), w, torch.empty(0), 0)
        assert all(torch.equal(y[i], alone[i]) for i in range(m)), m


@pytest.mark.parametrize("n,k", SHAPES)
def test_the_avx2_build_matches_float32_and_is_batch_invariant(avx2_kernel, n, k):
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g)
    x = torch.randn(SMALL_M_MAX_ROWS, k, generator=g).bfloat16()
    alone = [avx2_kernel.small_m_linear(x[i:i + 1].contiguous(), w, b, 0) for i in range(SMALL_M_MAX_ROWS)]
    for m in (1, 2, 3, 5, 8, 9, 17, SMALL_M_MAX_ROWS):
        y = avx2_kernel.small_m_linear(x[:m].contiguous(), w, b, 0)
        assert_matches_float32(y, x[:m], w, b)
        assert all(torch.equal(y[i:i + 1], alone[i]) for i in range(m)), m
