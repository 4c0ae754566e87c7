"""FlashAttention-2 in PyTorch: exact attention computed tile by tile with an online softmax.

Naive attention builds the score matrix ``S = Q K^T`` ([Lq, Lk] per head), softmaxes it, multiplies by ``V``:
O(N^2) extra memory and as much memory traffic. FlashAttention (Dao et al. 2022; FA2, Dao 2023) never builds
``S``. Each tile of queries walks over the keys/values tile by tile and keeps, per query row,

* ``m``   the largest score seen so far (for a numerically safe ``exp``),
* ``l``   the sum of ``exp(score - m)`` over the keys seen so far,
* ``acc`` the sum of ``exp(score - m) * v`` over the keys seen so far (un-normalised output).

When a new tile raises the maximum from ``m`` to ``m'``, everything accumulated so far was weighted by
``exp(. - m)`` and must now be weighted by ``exp(. - m')``: multiply ``l`` and ``acc`` by ``exp(m - m')``. After
the last tile, ``out = acc / l`` is exactly ``softmax(S) V`` (only float rounding differs) and
``lse = m + log(l)`` is the log-sum-exp of the row, which is what lets partial results over disjoint key ranges
be merged later (split-K decoding). FA2's changes over FA1 show up here as: the division by ``l`` happens once at
the end, the loop over query tiles is the outer (parallel) one, and causal tiles entirely above the diagonal are
skipped (the loop stops at the query tile's last position).

Extra memory per query tile is one ``[heads, block_m, block_n]`` score tile plus the ``O(block_m)`` statistics:
linear in the sequence length overall (the output itself), never quadratic.

This module is the executable explanation of the algorithm and the ``"flash-torch"`` backend; the Triton
kernels in ``cinq/kernels/triton/`` are the same loop with the tile loop mapped to GPU programs.
"""

from __future__ import annotations

from typing import Callable

import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.paged import context_slots

DEFAULT_BLOCK_M = 256  # query rows per tile
DEFAULT_BLOCK_N = 128  # keys per tile

# (start, end) -> (k, v) tiles [end - start, Hkv, D] of one sequence's keys start..end-1
KVTileLoader = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


def _attend(q: torch.Tensor, load_kv: KVTileLoader, kv_len: int, num_kv_heads: int, scale: float, causal: bool,
            block_m: int, block_n: int, out: torch.Tensor, lse: torch.Tensor,
            tree: torch.Tensor | None = None, window: int | None = None) -> None:
    """One sequence: q [Lq, Hq, D] are the last Lq positions of kv_len keys. Writes out [Lq, Hq, D], lse [Hq, Lq].

    ``tree`` (bool [Lq, Lq], with ``causal``): query row i sees the keys before the queries and, of the queries'
    own keys, those ``tree[i]`` marks (tree verification). ``window`` (with ``causal``): query row at position p
    sees keys > p - window only (a sliding-window layer); tiles wholly before the tile's windows are skipped."""
    lq, hq, d = q.shape
    group = hq // num_kv_heads
    acc_dtype = torch.promote_types(q.dtype, torch.float32)  # statistics and accumulator: fp32 at least
    offset = kv_len - lq  # position of query row 0
    for m0 in range(0, lq, block_m):  # on a GPU, one program per query tile, all running in parallel
        m1 = min(m0 + block_m, lq)
        m = m1 - m0
        # GQA: the `group` query heads sharing a kv head become extra rows, so each K/V tile is read once.
        qt = (q[m0:m1].to(acc_dtype) * scale).view(m, num_kv_heads, group, d)
        qt = qt.permute(1, 2, 0, 3).reshape(num_kv_heads, group * m, d)
        row_max = torch.full((num_kv_heads, group * m), float("-inf"), dtype=acc_dtype, device=q.device)
        row_sum = torch.zeros((num_kv_heads, group * m), dtype=acc_dtype, device=q.device)
        acc = torch.zeros((num_kv_heads, group * m, d), dtype=acc_dtype, device=q.device)
        q_pos = torch.arange(offset + m0, offset + m1, device=q.device)
        # Causal: keys after the tile's last query are never seen, so the loop ends there (FA2's tile skipping).
        kv_end = min(kv_len, offset + m1) if causal else kv_len
        kv_start = 0 if window is None else max(0, offset + m0 - window + 1) // block_n * block_n
        for n0 in range(kv_start, kv_end, block_n):
            n1 = min(n0 + block_n, kv_end)
            kt, vt = load_kv(n0, n1)  # [n, Hkv, D]
            s = torch.bmm(qt, kt.to(acc_dtype).permute(1, 2, 0))  # [Hkv, group*m, n]: one score tile
            in_tree = tree is not None and n1 > offset  # the tile holds some of the tree rows' own keys
            in_window = window is not None and n0 <= offset + m1 - 1 - window  # crosses some row's window edge
            if causal and (n1 - 1 > offset + m0 or in_tree or in_window):  # hide keys after each query
                k_pos = torch.arange(n0, n1, device=q.device)
                hidden = k_pos[None, :] > q_pos[:, None]  # [m, n]
                if in_window:
                    hidden |= k_pos[None, :] <= q_pos[:, None] - window
                if in_tree:  # and, among the tree rows, the non-ancestors
                    rel = k_pos - offset
                    hidden |= (rel >= 0)[None, :] & ~tree[m0:m1][:, rel.clamp(min=0)]
                s.view(num_kv_heads, group, m, n1 - n0).masked_fill_(hidden, float("-inf"))
            # Row 0 of every tile sees key 0 in the first KV tile, so new_max is finite from then on and a row
            # fully masked in a later tile just contributes exp(-inf) = 0.
            new_max = torch.maximum(row_max, s.amax(dim=-1))
            ref_max = new_max
            if tree is not None or window is not None:
                # a tree row need not see key 0 (the cache may hold only the tree, and a row need not see the
                # root); until its first visible key its max stays -inf: subtract 0 then, not -inf (NaN)
                ref_max = torch.where(new_max == float("-inf"), 0.0, new_max)
            p = s.sub_(ref_max[..., None]).exp_()
            correction = torch.exp(row_max - ref_max)  # re-weight what was summed under the old maximum
            row_sum = row_sum * correction + p.sum(dim=-1)
            acc = acc * correction[..., None] + torch.bmm(p, vt.to(acc_dtype).transpose(0, 1))
            row_max = new_max
        tile_out = (acc / row_sum[..., None]).view(num_kv_heads, group, m, d).permute(2, 0, 1, 3)
        out[m0:m1] = tile_out.reshape(m, hq, d)
        lse[:, m0:m1] = (row_max + row_sum.log()).view(hq, m)


def _check_tiles(block_m: int, block_n: int) -> None:
    if block_m < 1 or block_n < 1:
        raise InvalidParameterError(f"flash: block_m ({block_m}) and block_n ({block_n}) must be >= 1",
                                    param="block_m")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool = True,
                    block_m: int = DEFAULT_BLOCK_M, block_n: int = DEFAULT_BLOCK_N
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled attention of one sequence. q: [Lq, Hq, D]; k, v: [Lk, Hkv, D]; queries are the last Lq positions.

    Returns ``(out [Lq, Hq, D] in q.dtype, lse [Hq, Lq] in float32, float64 for float64 inputs)``.
    """
    _check_tiles(block_m, block_n)
    if causal and q.shape[0] > k.shape[0]:
        raise InvalidParameterError(
            f"flash: causal needs query length ({q.shape[0]}) <= key length ({k.shape[0]})", param="q")
    if q.shape[1] % k.shape[1]:
        raise InvalidParameterError(
            f"flash: query heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})", param="q")
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
    _attend(q, lambda a, b: (k[a:b], v[a:b]), k.shape[0], k.shape[1], scale, causal, block_m, block_n, out, lse)
    return out, lse


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, scale: float, causal: bool = True,
                           block_m: int = DEFAULT_BLOCK_M, block_n: int = DEFAULT_BLOCK_N
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed variable-length batch (FlashAttention's varlen API): sequence b owns rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` of k and v."""
    _check_tiles(block_m, block_n)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
    sq, sk = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(sq) - 1):
        ks, vs = k[sk[b]:sk[b + 1]], v[sk[b]:sk[b + 1]]
        if causal and sq[b + 1] - sq[b] > ks.shape[0]:
            raise InvalidParameterError(
                f"flash: sequence {b} has more queries ({sq[b + 1] - sq[b]}) than keys ({ks.shape[0]})",
                param="cu_seqlens_q")
        _attend(q[sq[b]:sq[b + 1]], lambda a, c, ks=ks, vs=vs: (ks[a:c], vs[a:c]), ks.shape[0], k.shape[1],
                scale, causal, block_m, block_n, out[sq[b]:sq[b + 1]], lse[:, sq[b]:sq[b + 1]])
    return out, lse


def flash_attention_paged(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                          out: torch.Tensor | None = None, block_m: int = DEFAULT_BLOCK_M,
                          block_n: int = DEFAULT_BLOCK_N) -> tuple[torch.Tensor, torch.Tensor]:
    """The serving step with K/V read through block tables: each KV tile is gathered slot by slot from the pages,
    exactly as a paged kernel computes its addresses. query [T, Hq, D]; kv_cache [2, blocks, block_size, Hkv, D].
    The decode-like sequences of a tree step see their context and their tree ancestors (``meta.tree_mask``,
    shared or per sequence).
    """
    _check_tiles(block_m, block_n)
    _, num_blocks, block_size, num_kv_heads, d = kv_cache.shape
    keys = kv_cache[0].view(num_blocks * block_size, num_kv_heads, d)
    values = kv_cache[1].view(num_blocks * block_size, num_kv_heads, d)
    out = torch.empty_like(query) if out is None else out
    lse = torch.empty(query.shape[1], query.shape[0], dtype=torch.promote_types(query.dtype, torch.float32),
                      device=query.device)
    starts = meta.query_start_loc.tolist()
    for i in range(meta.num_seqs):
        s, e, seq_len = starts[i], starts[i + 1], meta.seq_lens_cpu[i]
        slots = context_slots(meta.block_tables[i], seq_len, block_size)

        def load_kv(a: int, b: int, slots: torch.Tensor = slots) -> tuple[torch.Tensor, torch.Tensor]:
            return keys[slots[a:b]], values[slots[a:b]]

        _attend(query[s:e], load_kv, seq_len, num_kv_heads, scale, True, block_m, block_n, out[s:e], lse[:, s:e],
                meta.seq_tree_mask(i), meta.sliding_window)
    return out, lse
