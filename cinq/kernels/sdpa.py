"""Paged attention on top of ``torch.nn.functional.scaled_dot_product_attention``: the CPU hot path.

PyTorch's SDPA has a fused flash kernel on CPU (tiled, online softmax, O(N) memory), but only takes it for
batched 4-D inputs: 3-D ``[heads, L, D]`` inputs fall back to the math path (score matrix materialised, several
times slower), so every call here is 4-D. What is left is feeding it from the paged cache:

* decodes (the first ``num_decodes`` sequences, ``decode_query_len`` queries each) run as one call. The
  ``group`` query heads that share a kv head become query *rows* of that kv head (``[nd, Hkv, ql * group, D]``):
  SDPA then needs no GQA expansion (which it does slowly for one-row queries). A one-token decode sees its whole
  context; with several rows, row r sees all but the last ``ql - 1 - r`` keys. Contexts are gathered from the
  pages and padded to the longest; padded positions point at the sequence's own first slot (finite data,
  whatever the rest of the cache holds) and are masked out;
* prefill chunks run one call each: with nothing cached before them (``query_len == seq_len``) straight on the
  step's new K/V with ``is_causal``; after a cached prefix, on the gathered context with an offset causal mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cinq.kernels.cpu_native import paged_decode_native, paged_decode_varlen_native
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.paged import causal_mask, gather_context, window_mask


def sdpa_paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                         meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """[T, Hq, D] output of one serving step (see ``cinq.kernels.backends`` for the contract)."""
    nd = meta.num_decodes
    if nd == meta.num_seqs and out is None:  # decodes only (every step at batch 1): no output copy
        return sdpa_decode(query, kv_cache, meta, scale)
    out = torch.empty_like(query) if out is None else out
    if nd:
        out[:meta.num_decode_tokens] = sdpa_decode(query[:meta.num_decode_tokens], kv_cache, meta, scale)
    if meta.num_seqs == nd:
        return out
    if meta.ragged_decodes and meta.sliding_window is None and _ragged_tail(query, kv_cache, meta, scale, out):
        return out
    starts = meta.query_start_loc.tolist()
    for i in range(nd, meta.num_seqs):
        s, e = starts[i], starts[i + 1]
        q_len, seq_len = e - s, meta.seq_lens_cpu[i]
        q = query[s:e].transpose(0, 1).unsqueeze(0)  # [1, Hq, q, D]
        window = meta.sliding_window if meta.sliding_window is not None and meta.sliding_window < seq_len else None
        if q_len == seq_len and window is None:  # nothing cached before: the new K/V are the whole context
            k = key[s:e].transpose(0, 1).unsqueeze(0).to(q.dtype)
            v = value[s:e].transpose(0, 1).unsqueeze(0).to(q.dtype)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        elif window is not None:
            k, v = (key[s:e], value[s:e]) if q_len == seq_len else gather_context(kv_cache, meta.block_tables[i],
                                                                                   seq_len)
            out[s:e] = _windowed_chunk(query[s:e], k, v, seq_len, window, scale)
            continue
        else:
            k, v = gather_context(kv_cache, meta.block_tables[i], seq_len)
            mask = causal_mask(q_len, seq_len, query.device)
            o = F.scaled_dot_product_attention(q, k.transpose(0, 1).unsqueeze(0).to(q.dtype),
                                               v.transpose(0, 1).unsqueeze(0).to(q.dtype),
                                               attn_mask=mask, scale=scale, enable_gqa=True)
        out[s:e] = o[0].transpose(0, 1)
    return out


def _ragged_tail(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                 out: torch.Tensor) -> bool:
    """The sequences after the decode group, decode-like with their own row counts (``meta.ragged_decodes``), in
    one native call from the pages, into ``out``; False (nothing written) where the kernel is unavailable."""
    nd, first = meta.num_decodes, meta.num_decode_tokens
    starts = meta.query_start_loc[nd:meta.num_seqs + 1]
    tail = paged_decode_varlen_native(query[first:], kv_cache, meta.block_tables[nd:],
                                      meta.seq_lens[nd:meta.num_seqs], scale, starts - first)
    if tail is None:
        return False
    out[first:first + tail.shape[0]] = tail
    return True


def _windowed_chunk(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int, window: int,
                    scale: float) -> torch.Tensor:
    """A prefill chunk of a sliding-window layer: query [q, Hq, D] at the last q of seq_len positions, k / v
    [seq_len, Hkv, D]. Rows go ``window`` at a time, each slice against the keys its rows can see only
    (at most 2 * window - 1): O(q * window) work and mask, not O(q * seq_len)."""
    q_len = query.shape[0]
    first = seq_len - q_len  # position of query row 0
    out = torch.empty_like(query)
    for a in range(0, q_len, window):
        b = min(a + window, q_len)
        lo, hi = max(0, first + a - window + 1), first + b  # keys [lo, hi) hold every visible one
        mask = causal_mask(b - a, hi - lo, query.device) & window_mask(b - a, hi - lo, window, query.device)
        o = F.scaled_dot_product_attention(query[a:b].transpose(0, 1).unsqueeze(0),
                                           k[lo:hi].transpose(0, 1).unsqueeze(0).to(query.dtype),
                                           v[lo:hi].transpose(0, 1).unsqueeze(0).to(query.dtype),
                                           attn_mask=mask, scale=scale, enable_gqa=True)
        out[a:b] = o[0].transpose(0, 1)
    return out


def sdpa_decode(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
    """Decodes of the first ``meta.num_decodes`` sequences, ``meta.decode_query_len`` rows each:
    [nd * ql, Hq, D]. On the CPU the native kernel reads the pages directly (no gathered copy of the contexts);
    elsewhere, or if it cannot be built, one SDPA call."""
    nd, ql = meta.num_decodes, meta.decode_query_len
    # positional arguments: tests stand in for the native kernel with ``lambda *a: None``
    if meta.sliding_window is None:
        native = paged_decode_native(query, kv_cache, meta.block_tables, meta.seq_lens, scale, ql, meta.tree_mask)
    else:
        native = paged_decode_native(query, kv_cache, meta.block_tables, meta.seq_lens, scale, ql, meta.tree_mask,
                                     meta.sliding_window)
    if native is not None:
        return native
    _, hq, d = query.shape
    _, num_blocks, block_size, hkv, _ = kv_cache.shape
    group = hq // hkv
    if torch.compiler.is_compiling():  # host values would be guards, a recompile per length: the table's width
        nblocks = meta.block_tables.shape[1]
    else:
        nblocks = -(-max(meta.seq_lens_cpu[:nd]) // block_size)
    pos = torch.arange(nblocks * block_size, device=query.device)
    seq_lens = meta.seq_lens[:nd, None]
    valid = pos[None, :] < seq_lens  # [nd, L]
    if meta.sliding_window is not None:  # keys before the first row's window are masked out for every row
        valid &= pos[None, :] > seq_lens - ql - meta.sliding_window
    tables = meta.block_tables[:nd, :nblocks].long()
    slots = (tables[:, :, None] * block_size + torch.arange(block_size, device=query.device)).flatten(1)
    slots = torch.where(valid, slots, slots[:, :1])  # padding reads the sequence's own token 0, then is masked
    kv = kv_cache.view(2, num_blocks * block_size, hkv, d)[:, slots]  # [2, nd, L, Hkv, D]: one gather
    k = kv[0].transpose(1, 2).to(query.dtype)  # [nd, Hkv, L, D]
    v = kv[1].transpose(1, 2).to(query.dtype)
    if ql == 1:
        q = query.reshape(nd, hkv, group, d)  # GQA group as query rows
        mask = valid[:, None, None, :]
    else:
        # rows (r, g) of kv head h: query token r of the sequence, head h * group + g
        q = query.reshape(nd, ql, hkv, group, d).permute(0, 2, 1, 3, 4).reshape(nd, hkv, ql * group, d)
        if meta.tree_mask is None:
            last = seq_lens - ql + torch.arange(ql, device=query.device)  # [nd, ql]: position of query row r
            mask = pos[None, None, :] <= last[:, :, None]  # [nd, ql, L]; implies < seq_len
        else:
            mask = _tree_rows_mask(meta.tree_mask, pos, seq_lens - ql)
        if meta.sliding_window is not None:  # each row's own window
            last = seq_lens - ql + torch.arange(ql, device=query.device)
            mask = mask & (pos[None, None, :] > last[:, :, None] - meta.sliding_window)
        mask = mask.repeat_interleave(group, dim=1)[:, None]  # [nd, 1, ql * group, L]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if ql == 1:
        return o.reshape(nd, hq, d)
    return o.reshape(nd, hkv, ql, group, d).permute(0, 2, 1, 3, 4).reshape(nd * ql, hq, d)


def _tree_rows_mask(tree_mask: torch.Tensor, pos: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """[nd, ql, L] visibility of tree rows: key positions ``pos`` [L] before a sequence's first new row
    (``first`` [nd, 1]) are its cached context, seen by every row; of the ql new rows, row r of sequence s sees
    those its tree row marks (``tree_mask`` [ql, ql] shared, or [nd, ql, ql]); positions past the sequence
    (padding) none."""
    nd, ql = first.shape[0], tree_mask.shape[-1]
    rel = pos[None, :] - first  # [nd, L]: index of the new row at each position (< 0: cached, >= ql: padding)
    idx = rel.clamp(0, ql - 1)[:, None, :].expand(nd, ql, -1)
    tree = tree_mask.expand(nd, ql, ql).gather(2, idx)  # [nd, ql, L]: tree_mask[s, r, rel[s]]; expand: a view
    return (rel < 0)[:, None, :] | ((rel < ql)[:, None, :] & tree)
