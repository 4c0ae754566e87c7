"""Triton varlen causal flash prefill with GQA (FlashAttention-2 forward), on packed or paged K/V.

One program per (query tile, sequence, query head) walks the sequence's keys tile by tile with the online
softmax of ``cinq/kernels/flash.py`` (in base 2: ``exp2`` with ``log2(e)`` folded into the scale). Query heads
``h`` read kv head ``h // group`` (GQA). The key loop has two phases, as in FA2: tiles entirely at or before the
tile's first query position need no mask; the few tiles that cross the diagonal (or the sequence end) do.

Queries are the last ``q_len`` positions of ``kv_len`` keys, so the same kernel serves whole prompts
(``q_len == kv_len``) and prefill chunks after a cached prefix. K/V come either packed (``cu_seqlens_k``, the
FlashAttention varlen API) or from the paged cache through block tables (the serving path).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.triton import check_attention_inputs, interpreter_enabled, next_pow2
from cinq.kernels.triton.online_softmax import online_softmax_update

INTERPRETED = interpreter_enabled()
LOG2E = 1.0 / math.log(2.0)


@triton.jit
def _kv_tiles(acc, m_i, l_i, q, q_pos, k_base, v_base, bt_row, kv_start, kv_len, n_lo, n_hi, qk_scale,
              stride_kb, stride_kt, stride_vb, stride_vt, offs_d, d_mask, window,
              BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, MASKED: tl.constexpr,
              CAUSAL: tl.constexpr, FP32_DOT: tl.constexpr, WINDOW: tl.constexpr):
    for n0 in range(n_lo, n_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        if PAGED:  # token n lives in block block_table[n // PAGE_SIZE] at offset n % PAGE_SIZE
            blk = tl.load(bt_row + offs_n // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
            k_rows = blk * stride_kb + (offs_n % PAGE_SIZE) * stride_kt
            v_rows = blk * stride_vb + (offs_n % PAGE_SIZE) * stride_vt
        else:
            k_rows = (kv_start + offs_n).to(tl.int64) * stride_kt
            v_rows = (kv_start + offs_n).to(tl.int64) * stride_vt
        kt = tl.load(k_base + k_rows[None, :] + offs_d[:, None], mask=n_mask[None, :] & d_mask[:, None], other=0.0)
        if FP32_DOT:  # fp32 inputs (exact, no tf32) and the interpreter (its bf16 dot is broken)
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, kt.to(q.dtype))
        s = s * qk_scale
        if MASKED:
            keep = n_mask[None, :]
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= q_pos[:, None])
            if WINDOW:  # a sliding-window layer: keys older than the row's window are hidden
                keep = keep & (offs_n[None, :] > q_pos[:, None] - window)
            s = tl.where(keep, s, float("-inf"))
        # Key 0 is in the first tile and visible to every row, so m_new is finite from the first tile on.
        v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        m_i, l_i, acc = online_softmax_update(s, v, m_i, l_i, acc, q, FP32_DOT)
    return acc, m_i, l_i


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, kv_info_ptr, block_tables_ptr,
                    seq_offset, qk_scale, window,
                    stride_qt, stride_qh, stride_ot, stride_oh, stride_lse_h,
                    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_bt,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, CAUSAL: tl.constexpr,
                    FP32_DOT: tl.constexpr, STORE_LSE: tl.constexpr, WINDOW: tl.constexpr):
    pid_m = tl.program_id(0)
    b = tl.program_id(1) + seq_offset
    h = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if pid_m * BLOCK_M >= q_len:  # this sequence has fewer query tiles than the longest one
        return
    if PAGED:
        kv_start = 0
        kv_len = tl.load(kv_info_ptr + b)  # seq_lens
    else:
        kv_start = tl.load(kv_info_ptr + b)  # cu_seqlens_k
        kv_len = tl.load(kv_info_ptr + b + 1) - kv_start

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM  # head dims like 80 are padded to a power of two
    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    q_pos = kv_len - q_len + offs_m

    kvh = h // GROUP
    k_base = k_ptr + kvh * stride_kh
    v_base = v_ptr + kvh * stride_vh
    bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        first_pos = kv_len - q_len + pid_m * BLOCK_M
        full_end = (first_pos + 1) // BLOCK_N * BLOCK_N  # tiles wholly <= the first query: nothing to mask
        hi = tl.minimum(kv_len, first_pos + BLOCK_M)  # keys after the last query are never read
    else:
        full_end = kv_len // BLOCK_N * BLOCK_N
        hi = kv_len
    if WINDOW:  # causal too: every tile from the first row's window start is masked (no key 0 tile needed)
        first_pos = kv_len - q_len + pid_m * BLOCK_M
        lo = tl.maximum(first_pos - window + 1, 0) // BLOCK_N * BLOCK_N
        acc, m_i, l_i = _kv_tiles(acc, m_i, l_i, q, q_pos, k_base, v_base, bt_row, kv_start, kv_len, lo, hi,
                                  qk_scale, stride_kb, stride_kt, stride_vb, stride_vt, offs_d, d_mask, window,
                                  BLOCK_N, PAGE_SIZE, PAGED, True, CAUSAL, FP32_DOT, True)
    else:
        acc, m_i, l_i = _kv_tiles(acc, m_i, l_i, q, q_pos, k_base, v_base, bt_row, kv_start, kv_len, 0, full_end,
                                  qk_scale, stride_kb, stride_kt, stride_vb, stride_vt, offs_d, d_mask, window,
                                  BLOCK_N, PAGE_SIZE, PAGED, False, CAUSAL, FP32_DOT, False)
        acc, m_i, l_i = _kv_tiles(acc, m_i, l_i, q, q_pos, k_base, v_base, bt_row, kv_start, kv_len, full_end, hi,
                                  qk_scale, stride_kb, stride_kt, stride_vb, stride_vt, offs_d, d_mask, window,
                                  BLOCK_N, PAGE_SIZE, PAGED, True, CAUSAL, FP32_DOT, False)
    out = acc / l_i[:, None]
    tl.store(o_ptr + q_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
    if STORE_LSE:  # natural-log LSE, [Hq, T]
        tl.store(lse_ptr + h * stride_lse_h + q_rows, (m_i + tl.math.log2(l_i)) / 1.4426950408889634, mask=m_mask)


# Compiled: autotuned once per (head dim, group, paged, causal, dot precision) over these starting points;
# configs that do not fit the card's shared memory are dropped by the autotuner. Interpreted: small fixed tiles
# (numpy cost grows with the number of loop steps, not with the tile size).
_GPU_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
                for bm, bn, w, st in [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 32, 4, 4),
                                      (64, 64, 4, 4), (64, 32, 4, 2)]]
_prefill_tuned = None if INTERPRETED else triton.autotune(
    _GPU_CONFIGS, key=["HEAD_DIM", "GROUP", "PAGED", "CAUSAL", "FP32_DOT", "WINDOW"])(_prefill_kernel)
INTERPRETER_TILES = (16, 16)


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None,
            cu_q: torch.Tensor, kv_info: torch.Tensor, block_tables: torch.Tensor, seq_offset: int, num_seqs: int,
            max_q_len: int, scale: float, causal: bool, paged: bool, page_size: int,
            kv_strides: tuple[int, int, int, int, int, int], window: int | None = None) -> None:
    head_dim, hq, hkv = q.shape[-1], q.shape[1], k.shape[-2]
    args = (q, k, v, out, lse if lse is not None else out, cu_q, kv_info, block_tables, seq_offset, scale * LOG2E,
            window or 0,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
            *kv_strides, block_tables.stride(0))
    consts = dict(GROUP=hq // hkv, HEAD_DIM=head_dim, BLOCK_D=max(16, next_pow2(head_dim)), PAGE_SIZE=page_size,
                  PAGED=paged, CAUSAL=causal, STORE_LSE=lse is not None, WINDOW=window is not None,
                  FP32_DOT=INTERPRETED or q.dtype == torch.float32 or k.dtype == torch.float32)
    if INTERPRETED:
        block_m, block_n = INTERPRETER_TILES
        _prefill_kernel[(triton.cdiv(max_q_len, block_m), num_seqs, hq)](
            *args, BLOCK_M=block_m, BLOCK_N=block_n, **consts, num_warps=1, num_stages=1)
    else:
        _prefill_tuned[lambda meta: (triton.cdiv(max_q_len, meta["BLOCK_M"]), num_seqs, hq)](*args, **consts)


def flash_prefill_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, max_seqlen_q: int, scale: float, causal: bool = True,
                         out: torch.Tensor | None = None, return_lse: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Packed varlen attention. q [Tq, Hq, D]; k, v [Tk, Hkv, D]; cu_seqlens int32 [B + 1] on q's device.

    Queries of sequence b are the last ``len_q(b)`` positions of its ``len_k(b)`` keys. Returns
    ``(out [Tq, Hq, D], lse [Hq, Tq] float32 or None)``.
    """
    out = torch.empty_like(q) if out is None else out
    check_attention_inputs(q, k.dtype, out, INTERPRETED)
    q = q if q.stride(-1) == 1 else q.contiguous()
    if q.shape[1] % k.shape[1] or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise InvalidParameterError(
            f"flash_prefill_varlen: need q [T, Hq, D], k = v [T, Hkv, D] with Hq % Hkv == 0; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}", param="q")
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device) if return_lse else None
    num_seqs = cu_seqlens_q.shape[0] - 1
    if num_seqs and q.shape[0]:
        dummy_tables = torch.zeros(1, 1, dtype=torch.int32, device=q.device)
        _launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, dummy_tables, 0, num_seqs, max_seqlen_q, scale,
                causal, False, 1, (0, k.stride(0), k.stride(1), 0, v.stride(0), v.stride(1)))
    return out, lse


def flash_prefill_paged(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                        out: torch.Tensor, first_seq: int = 0) -> torch.Tensor:
    """Sequences ``first_seq..`` of the step: causal attention of their new tokens over the paged context."""
    check_attention_inputs(query, kv_cache.dtype, out, INTERPRETED)
    query = query if query.stride(-1) == 1 else query.contiguous()
    num_seqs = meta.num_seqs - first_seq
    if num_seqs <= 0:
        return out
    max_q_len = max(meta.query_lens_cpu[first_seq:])
    k, v = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, Hkv, D]
    if k.stride(-1) != 1:
        raise InvalidParameterError("attention backend 'triton': kv_cache needs a contiguous last dim",
                                    param="kv_cache")
    _launch(query, k, v, out, None, meta.query_start_loc, meta.seq_lens, meta.block_tables, first_seq, num_seqs,
            max_q_len, scale, True, True, kv_cache.shape[2],
            (k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2)), meta.sliding_window)
    return out
