"""The native CPU kernels: paged decode (matches the float64 reference, and the PyTorch fallback too), the skinny
linear, the KV write (equal to index_copy_)."""

from __future__ import annotations

import pytest
import torch

from cinq.kernels import sdpa
from cinq.kernels.cpu_native import native_module, paged_decode_native, write_kv_native
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.paged import write_kv_index_copy
from cinq.kernels.reference import paged_attention_reference


def decode_step(nd: int, hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    bs, nb = 16, 64
    lens = torch.randint(1, 200, (nd,), generator=g)
    lens[0] = 1  # a one-token context
    cache = torch.full((2, nb, bs, hkv, d), float("nan"), dtype=dtype)  # unwritten slots poison a wrong read
    perm = torch.randperm(nb, generator=g)
    max_blocks = int(-(-lens.max() // bs))
    tables = torch.zeros(nd, max_blocks, dtype=torch.int32)
    used = 0
    for i, n in enumerate(lens.tolist()):
        k = -(-n // bs)
        tables[i, :k] = perm[used:used + k].int()
        used += k
        flat = cache.view(2, nb * bs, hkv, d)
        slots = (tables[i, :k].long()[:, None] * bs + torch.arange(bs)).flatten()[:n]
        flat[:, slots] = torch.randn(2, n, hkv, d, generator=g).to(dtype)
    q = torch.randn(nd, hq, d, generator=g).to(dtype)
    meta = AttentionMetadata(slot_mapping=torch.zeros(nd, dtype=torch.long),
                             query_start_loc=torch.arange(nd + 1, dtype=torch.int32),
                             seq_lens=lens.int(), block_tables=tables, query_lens_cpu=[1] * nd,
                             seq_lens_cpu=lens.tolist(), num_decodes=nd, max_query_len=1,
                             max_seq_len=int(lens.max()), block_size=bs)
    return q, cache, meta


def test_native_kernel_builds_on_this_platform():
    assert native_module("paged_decode") is not None


def test_loading_kernels_leaves_the_build_flags_and_so_the_cache_keys_alone():
    """torch's load() extends the flag lists it is given; the builds' cache key hashes the flags, so a mutated list
    gave the next kernel in the process another key (and a rebuild) depending on the order kernels loaded in."""
    from cinq.kernels import cpu_native
    if native_module("kv_write") is None:
        pytest.skip("native CPU kernels unavailable here")
    before = (list(cpu_native._CFLAGS), list(cpu_native._LDFLAGS))
    cpu_native._build_or_load("kv_write")
    cpu_native._build_or_load("rms_norm")
    assert (cpu_native._CFLAGS, cpu_native._LDFLAGS) == before


def test_a_killed_builds_lock_is_removed_and_a_live_ones_kept(tmp_path):
    """torch's load() waits forever on a build folder's lock file: a build killed mid-way left one, and every later
    start hung at that kernel's load."""
    import os
    import time

    from cinq.kernels.cpu_native import STALE_LOCK_S, clear_stale_lock
    lock = tmp_path / "lock"
    assert not clear_stale_lock(tmp_path)  # no lock
    lock.touch()
    assert not clear_stale_lock(tmp_path) and lock.exists()  # a build under way
    old = time.time() - STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    assert clear_stale_lock(tmp_path) and not lock.exists()


@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 80), (16, 2, 128), (4, 1, 256)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_native_and_fallback_match_reference(hq, hkv, d, dtype, tol, monkeypatch):
    q, cache, meta = decode_step(5, hq, hkv, d, dtype, seed=hq + d)
    ref = paged_attention_reference(q.double(), cache.double(), meta, d ** -0.5)[0]
    native = paged_decode_native(q, cache, meta.block_tables, meta.seq_lens, d ** -0.5)
    assert native is not None and native.dtype == dtype
    rel = lambda x: ((x.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    assert rel(native) <= tol
    monkeypatch.setattr(sdpa, "paged_decode_native", lambda *a: None)
    cache_finite = torch.nan_to_num(cache)  # the padded-gather fallback reads padding (masked, but must be finite)
    assert rel(sdpa.sdpa_decode(q, cache_finite, meta, d ** -0.5)) <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_reads_a_query_split_from_the_merged_qkv_output_as_its_copy(dtype):
    """The layer hands the kernel q as a view of the qkv projection's output (a token's heads contiguous, tokens
    further apart): the kernel reads it in place, with the result of the contiguous copy, in the query's dtype."""
    q, cache, meta = decode_step(4, 8, 2, 64, dtype, seed=3)
    qkv = torch.cat([q.flatten(1), torch.randn(4, 2 * 2 * 64).to(dtype)], dim=1)  # [T, q + k + v]
    view = qkv[:, :8 * 64].view(4, 8, 64)
    assert not view.is_contiguous()
    out = paged_decode_native(view, cache, meta.block_tables, meta.seq_lens, 0.125)
    assert out is not None and out.dtype == dtype
    assert torch.equal(out, paged_decode_native(view.contiguous(), cache, meta.block_tables, meta.seq_lens, 0.125))


def _runs_under(setting: str, values: tuple[int, ...], hq: int, hkv: int, dtype: torch.dtype, seed: int,
                d: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """paged_decode (one query row) and paged_decode_window (3 rows, a window of 37) over the same decode step (5
    contexts up to 199 tokens) with the paged_decode module's ``setting`` at each of ``values`` (restored after)."""
    mod = native_module("paged_decode")
    before = getattr(mod, setting)()
    q, cache, meta = decode_step(5, hq, hkv, d, dtype, seed=seed)
    q3 = torch.cat([q, q.flip(0), q * 0.5]).view(3, 5, hq, d).transpose(0, 1).reshape(15, hq, d)  # ql = 3
    lens = meta.seq_lens.clamp(min=3)
    cache = torch.nan_to_num(cache)  # the clamped contexts read 2 unwritten slots
    no_tree, runs = torch.empty(0, dtype=torch.bool), []
    try:
        for value in values:
            getattr(mod, "set_" + setting)(value)
            runs.append((mod.paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.125, 1, no_tree),
                         mod.paged_decode_window(q3, cache, meta.block_tables, lens, 0.125, 3, no_tree, 37)))
    finally:
        getattr(mod, "set_" + setting)(before)
    return runs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_results_do_not_depend_on_its_key_tile(dtype):
    """K/V are widened a tile of keys at a time (decode_attention.h): tiles of 8 keys, a few dozen, or one past every
    context give the same bits (the 8-key score groups never move). Contexts up to 199 tokens, windows and query
    rows of k + 1 tokens included."""
    first, *rest = _runs_under("tile_floats", (1, 3000, 1 << 30), 8, 2, dtype, seed=11)
    for run in rest:
        assert all(torch.equal(a, b) for a, b in zip(first, run))


def test_bf16_decode_results_do_not_depend_on_how_far_it_reads_ahead():
    """The bf16 path reads a call's K/V rows ahead in segments of touch_bytes (decode_attention_bf16.h), keeping
    each query row's weighted sum between segments: segments of one 16-key tile, of a few tiles, or the whole span
    give the same bits (SmolLM2's and Gemma 3's heads, contexts up to 199 tokens, query rows of k + 1 tokens with a
    window), and
    a context of 700 tokens (segmented at the default) matches the float64 reference."""
    for hq, hkv, d in ((9, 3, 64), (4, 1, 256)):  # SmolLM2's heads, Gemma 3's (two column chunks of V)
        first, *rest = _runs_under("touch_bytes", (1, 20_000, 1 << 30), hq, hkv, torch.bfloat16, seed=12, d=d)
        for run in rest:
            assert all(torch.equal(a, b) for a, b in zip(first, run))
    before = native_module("paged_decode").touch_bytes()
    g = torch.Generator().manual_seed(5)
    n, bs = 700, 16
    long = torch.randn(2, -(-n // bs), bs, 3, 64, generator=g).to(torch.bfloat16)
    assert 2 * n * 3 * 64 * 2 > before  # the default reads it in segments
    tables = torch.arange(long.shape[1], dtype=torch.int32).flip(0)[None]  # pages in reverse order
    meta = AttentionMetadata(slot_mapping=torch.zeros(1, dtype=torch.long),
                             query_start_loc=torch.arange(2, dtype=torch.int32), seq_lens=torch.tensor([n]).int(),
                             block_tables=tables, query_lens_cpu=[1], seq_lens_cpu=[n], num_decodes=1,
                             max_query_len=1, max_seq_len=n, block_size=bs)
    q = torch.randn(1, 9, 64, generator=g).to(torch.bfloat16)
    ref = paged_attention_reference(q.double(), long.double(), meta, 0.125)[0]
    out = paged_decode_native(q, long, tables, meta.seq_lens, 0.125)
    assert out is not None and ((out.double() - ref).norm() / ref.norm()).item() <= 1e-2


def test_a_kernel_build_is_keyed_by_the_headers_it_includes_only():
    """Editing one header rebuilds the kernels that include it (directly or through another header), not all."""
    from cinq.kernels import cpu_native
    sources = cpu_native._SOURCES
    decode = cpu_native._included_headers((sources / "paged_decode.cpp").read_bytes())
    # the rest through decode_attention.h (bf16.h two headers down)
    assert set(decode) == {"decode_attention.h", "decode_attention_bf16.h", "decode_attention_ops.h", "bf16.h",
                           "small_m.h"}
    assert "decode_attention.h" not in cpu_native._included_headers((sources / "kv_write.cpp").read_bytes())


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k,bias", [(64, 96, False), (200, 40, True), (2048, 768, False)])
def test_small_m_linear_matches_float_linear(rows, n, k, bias):
    from cinq.kernels.cpu_native import small_m_linear_native
    g = torch.Generator().manual_seed(rows * n + k)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g) if bias else None
    with torch.no_grad():
        got = small_m_linear_native(x, w, b)
    ref = torch.nn.functional.linear(x.float(), w.float(), b)
    assert got is not None and got.dtype == torch.bfloat16 and got.shape == (rows, n)
    assert ((got.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_small_m_linear_takes_a_bf16_bias_as_its_float_widening():
    from cinq.kernels.cpu_native import small_m_linear_native
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(2, 48, generator=g).bfloat16(), torch.randn(40, 48, generator=g).bfloat16()
    b = torch.randn(40, generator=g).bfloat16()
    with torch.no_grad():
        got, ref = small_m_linear_native(x, w, b), small_m_linear_native(x, w, b.float())
        half = small_m_linear_native(x, w, b.half())  # other dtypes are widened by the caller
    assert got is not None and torch.equal(got, ref) and torch.equal(half, ref)


def test_small_m_linear_declines_what_it_does_not_cover():
    from cinq.kernels.cpu_native import small_m_linear_native, small_m_rows
    w = torch.randn(8, 16).bfloat16()
    with torch.no_grad():
        too_many = torch.randn(small_m_rows() + 1, 16).bfloat16()
        assert small_m_linear_native(too_many, w, None) is None
        assert small_m_linear_native(torch.randn(1, 16), w.float(), None) is None  # not bf16
    assert small_m_linear_native(torch.randn(1, 16).bfloat16(), w, None) is None  # autograd on


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_native_matches_index_copy(dtype):
    g = torch.Generator().manual_seed(3)
    hkv, d, bs, nb, tokens = 2, 32, 4, 10, 7
    qkv = torch.randn(tokens, (4 + 2 * hkv) * d, generator=g).to(dtype)
    _, k, v = qkv.split([4 * d, hkv * d, hkv * d], dim=-1)
    k, v = k.view(tokens, hkv, d), v.view(tokens, hkv, d)  # strided, as the model's split
    slots = torch.randperm(nb * bs, generator=g)[:tokens]
    want = torch.randn(2, nb, bs, hkv, d, generator=g).to(dtype)
    got = want.clone()
    write_kv_index_copy(k, v, want, slots)
    assert write_kv_native(k, v, got, slots)
    assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="outside the cache"):
        write_kv_native(k, v, got, torch.full((tokens,), nb * bs))
    assert not write_kv_native(k.float() if dtype != torch.float32 else k.double(), v, got, slots)  # a cast: no


@pytest.mark.parametrize("rows", [33, 48, 70])
def test_chunked_small_m_linear_equals_a_float32_linear_past_the_small_m_rows(rows: int):
    from cinq.kernels.cpu_native import bf16_gemm_is_emulated, chunked_small_m_linear, small_m_rows
    torch.manual_seed(rows)
    x = torch.randn(1, rows, 96, dtype=torch.bfloat16)
    w = torch.randn(40, 96, dtype=torch.bfloat16)
    b = torch.randn(40, dtype=torch.bfloat16)
    with torch.no_grad():
        y = chunked_small_m_linear(x, w, b)
        if not bf16_gemm_is_emulated() or small_m_rows() == 0:  # a CPU with bf16 instructions keeps torch's GEMM
            assert y is None
            return
        assert y is not None and y.shape == (1, rows, 40) and y.dtype == torch.bfloat16
        ref = torch.nn.functional.linear(x.float(), w.float(), b.float())
        # each output rounded once to bf16 from a float32 sum: within one bf16 ulp of the float32 result
        assert ((y.float() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-3).all()
        assert chunked_small_m_linear(x[:, :small_m_rows()], w, b) is None  # decode-sized: the plain kernel's job


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ragged_rows_give_each_sequence_what_its_own_row_count_gives(dtype):
    """paged_decode_varlen (sequences verifying different numbers of drafts, or none): each sequence's rows are bit
    for bit a uniform call's with its row count alone, at 1 and 2 threads and in any cut of the sequences; starts
    that do not cover the query, or give a sequence no rows or more than its context, are refused by name."""
    mod = native_module("paged_decode")
    q1, cache, meta = decode_step(4, 8, 2, 64, dtype, seed=5)
    rows = [1, 3, 2, 5]
    lens = meta.seq_lens.clamp(min=5)
    cache = torch.nan_to_num(cache)  # the clamped contexts read unwritten slots
    starts = torch.tensor([0, 1, 4, 6, 11], dtype=torch.int32)
    q = torch.randn(11, 8, 64).to(dtype)
    no_tree = torch.empty(0, dtype=torch.bool)
    whole = mod.paged_decode_varlen(q, cache, meta.block_tables, lens, 0.125, starts)
    for s, n in enumerate(rows):
        a, b = int(starts[s]), int(starts[s + 1])
        alone = mod.paged_decode(q[a:b], cache, meta.block_tables[s:s + 1], lens[s:s + 1], 0.125, n, no_tree)
        assert torch.equal(whole[a:b], alone), s
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(mod.paged_decode_varlen(q, cache, meta.block_tables, lens, 0.125, starts), whole)
    finally:
        torch.set_num_threads(threads)
    out = torch.full_like(q, float("nan"))
    for begin, end in ((0, 2), (2, 2), (2, 4)):
        mod.paged_decode_varlen_seqs(q, cache, meta.block_tables, lens, 0.125, starts, out, begin, end)
    assert torch.equal(out, whole)
    for bad, says in (([0, 1, 1, 6, 11], "sequence 1 needs 1 to seq_len"), ([0, 1, 4, 6, 10], "from 0 to"),
                      ([0, 1, 4, 11], "sequence 2 needs 1 to seq_len")):
        with pytest.raises(RuntimeError, match=says):
            mod.paged_decode_varlen(q, cache, meta.block_tables, lens.clamp(max=6), 0.125,
                                    torch.tensor(bad, dtype=torch.int32))
