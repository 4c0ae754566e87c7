"""Triton paged decode attention: ``decode_query_len`` new queries per sequence (1 for plain decoding, k + 1 to
verify k draft tokens), K/V read through its block table, split-K.

Decode is bandwidth bound: every cached key and value is read once per step and used for a handful of flops.
So one program serves all ``group`` query heads that share a kv head, for every query token of the sequence
(``QLEN * group`` rows stacked as the M dimension of the dot, padded to 16; row r sees the keys up to
``seq_len - QLEN + r``; a tree verification step instead lets row r see the cached context and the new rows its
``tree_mask`` row marks, one tree for all sequences or one per sequence), and long contexts are cut into
``num_splits`` key ranges processed by separate programs to keep the GPU busy when the batch is small
(FlashDecoding). Each split keeps the usual online-softmax state and writes its normalised partial output with its
log-sum-exp; a second small kernel merges the splits:
``out = sum_s exp(lse_s - max) * out_s / sum_s exp(lse_s - max)``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.triton import check_attention_inputs, check_device, interpreter_enabled, next_pow2
from cinq.kernels.triton.online_softmax import online_softmax_update

INTERPRETED = interpreter_enabled()
LOG2E = 1.0 / math.log(2.0)
MIN_SPLIT_TOKENS = 256  # below this a split's fixed cost outweighs the parallelism it adds


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, o_ptr, part_o_ptr, part_lse_ptr, seq_lens_ptr, block_tables_ptr, tree_ptr,
                   qk_scale, split_len, stride_tree, window,
                   stride_qt, stride_qh, stride_ot, stride_oh,
                   stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_bt,
                   stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                   GROUP: tl.constexpr, QLEN: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, SPLIT: tl.constexpr, FP32_DOT: tl.constexpr,
                   TREE: tl.constexpr, WINDOW: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    lo = split * split_len
    hi = tl.minimum(seq_len, lo + split_len)

    offs_m = tl.arange(0, BLOCK_G)  # row m = (query token m // GROUP, head kvh * GROUP + m % GROUP)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_m < GROUP * QLEN
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_m % GROUP
    tokens = b.to(tl.int64) * QLEN + offs_m // GROUP
    last = seq_len - QLEN + offs_m // GROUP  # the last key position each row sees
    q = tl.load(q_ptr + tokens[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    k_base = k_ptr + kvh * stride_kh
    v_base = v_ptr + kvh * stride_vh

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    start = lo
    if WINDOW:  # a sliding-window layer: tiles before the first row's window are never read
        start = tl.maximum(lo, tl.maximum(seq_len - QLEN + 1 - window, 0) // BLOCK_N * BLOCK_N)
    for n0 in range(start, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        blk = tl.load(bt_row + offs_n // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
        k_rows = blk * stride_kb + (offs_n % PAGE_SIZE) * stride_kt
        v_rows = blk * stride_vb + (offs_n % PAGE_SIZE) * stride_vt
        kt = tl.load(k_base + k_rows[None, :] + offs_d[:, None], mask=n_mask[None, :] & d_mask[:, None], other=0.0)
        if FP32_DOT:
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, kt.to(q.dtype))
        # with one query it sees the whole context; later query rows see later keys
        keep = n_mask[None, :] & (offs_n[None, :] <= last[:, None])
        if WINDOW:
            keep = keep & (offs_n[None, :] > last[:, None] - window)
        if TREE:  # of the new rows' own keys, only those the row's tree_mask row ([QLEN, QLEN] int8) marks
            rel = offs_n - (seq_len - QLEN)  # < 0: cached context
            own = keep & (rel >= 0)[None, :] & g_mask[:, None]  # padding rows past QLEN read nothing
            # this sequence's tree: stride_tree = QLEN * QLEN per sequence, 0 when one tree is shared
            tree_row = tree_ptr + b.to(tl.int64) * stride_tree + (offs_m // GROUP) * QLEN
            seen = tl.load(tree_row[:, None] + rel[None, :], mask=own, other=0)
            keep = keep & ((rel < 0)[None, :] | (seen != 0))
        s = tl.where(keep, s * qk_scale, float("-inf"))
        v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        m_i, l_i, acc = online_softmax_update(s, v, m_i, l_i, acc, q, FP32_DOT)

    nonempty = l_i > 0  # a split past the end of a short sequence saw no key
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    gd_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        tl.store(part_o_ptr + tokens[:, None] * stride_pb + heads[:, None] * stride_ph + split * stride_ps
                 + offs_d[None, :], out, mask=gd_mask)
        lse = tl.where(nonempty, m_i + tl.math.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))  # base 2
        tl.store(part_lse_ptr + tokens * stride_lb + heads * stride_lh + split, lse, mask=g_mask)
    else:
        tl.store(o_ptr + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=gd_mask)


@triton.jit
def _merge_kernel(o_ptr, part_o_ptr, part_lse_ptr, stride_ot, stride_oh, stride_pb, stride_ph, stride_ps,
                  stride_lb, stride_lh, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=s_mask, other=float("-inf"))
    w = tl.math.exp2(lse - tl.max(lse, 0))  # split 0 always holds keys, so the max is finite
    parts = tl.load(part_o_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
                    mask=s_mask[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    out = tl.sum(parts * w[:, None], 0) / tl.sum(w, 0)
    tl.store(o_ptr + b * stride_ot + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Enough splits to give every SM about two programs, none shorter than MIN_SPLIT_TOKENS keys."""
    if INTERPRETED or device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.cdiv(2 * sms, max(1, batch * num_kv_heads))
    return max(1, min(want, triton.cdiv(max_seq_len, MIN_SPLIT_TOKENS), 64))


def paged_decode(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                 out: torch.Tensor, num_decodes: int | None = None, num_splits: int | None = None) -> torch.Tensor:
    """Decode attention of the first ``num_decodes`` sequences (default ``meta.num_decodes``),
    ``meta.decode_query_len`` queries each (causal among them, or as ``meta.tree_mask`` says: [ql, ql] shared,
    or [num_decodes, ql, ql] per sequence).

    query, out: [>= num_decodes * ql, Hq, D] (the first num_decodes * ql rows are used); kv_cache
    [2, blocks, block_size, Hkv, D].
    """
    check_device(query, INTERPRETED)
    nd = meta.num_decodes if num_decodes is None else num_decodes
    if nd == 0:
        return out
    check_attention_inputs(query, kv_cache.dtype, out, INTERPRETED)
    query = query if query.stride(-1) == 1 else query.contiguous()
    _, _, page_size, hkv, head_dim = kv_cache.shape
    hq = query.shape[1]
    group = hq // hkv
    ql = meta.decode_query_len
    k, v = kv_cache[0], kv_cache[1]
    max_len = max(meta.seq_lens_cpu[:nd])
    block_n = 16 if INTERPRETED else 64
    if num_splits is None:
        num_splits = choose_num_splits(nd, hkv, max_len, query.device)
    if num_splits < 1:
        raise InvalidParameterError(f"paged_decode: num_splits must be >= 1, got {num_splits}", param="num_splits")
    split_len = triton.cdiv(triton.cdiv(max_len, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_len, split_len)  # rounding the split length up may leave fewer splits
    block_d = max(16, next_pow2(head_dim))
    split = num_splits > 1
    if split:
        part_o = torch.empty(nd * ql, hq, num_splits, head_dim, dtype=torch.float32, device=query.device)
        part_lse = torch.empty(nd * ql, hq, num_splits, dtype=torch.float32, device=query.device)
    else:
        part_o = part_lse = out  # unused
    tree = meta.tree_mask
    stride_tree = 0  # shared [ql, ql] tree (or none): every sequence reads the same one
    if tree is not None:
        tree = tree.to(torch.int8).contiguous()  # a byte per entry: bool pointers are not portable across versions
        if tree.dim() == 3:
            stride_tree = tree.stride(0)
    _decode_kernel[(nd, hkv, num_splits)](
        query, k, v, out, part_o, part_lse, meta.seq_lens, meta.block_tables, tree if tree is not None else out,
        scale * LOG2E, split_len, stride_tree, meta.sliding_window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), meta.block_tables.stride(0),
        part_o.stride(0) if split else 0, part_o.stride(1) if split else 0, part_o.stride(2) if split else 0,
        part_lse.stride(0) if split else 0, part_lse.stride(1) if split else 0,
        GROUP=group, QLEN=ql, BLOCK_G=max(16, next_pow2(group * ql)), HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_N=block_n,
        PAGE_SIZE=page_size, SPLIT=split,
        FP32_DOT=INTERPRETED or query.dtype == torch.float32 or kv_cache.dtype == torch.float32,
        TREE=tree is not None, WINDOW=meta.sliding_window is not None, num_warps=4, num_stages=1 if INTERPRETED else 2)
    if split:
        _merge_kernel[(nd * ql, hq)](
            out, part_o, part_lse, out.stride(0), out.stride(1), part_o.stride(0), part_o.stride(1),
            part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
            NUM_SPLITS=num_splits, BLOCK_S=next_pow2(num_splits), HEAD_DIM=head_dim, BLOCK_D=block_d)
    return out
