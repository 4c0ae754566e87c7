"""Paged attention on top of ``torch.nn.functional.scaled_dot_product_attention``: the CPU hot path.

PyTorch's SDPA has a fused flash kernel on CPU (tiled, online softmax, O(N) memory), but only takes it for
batched 4-D inputs: 3-D ``[heads, L, D]`` inputs fall back to the math path (score matrix materialised, several
times slower), so every call here is 4-D. What is left is feeding it from the paged cache:

* decodes (the first ``num_decodes`` sequences, one query each) run as one call. The ``group`` query heads that
  share a kv head become ``group`` query *rows* of that kv head (``[nd, Hkv, group, D]``): a decode query sees
  its whole context, so they share one mask, and SDPA needs no GQA expansion (which it does slowly for one-row
  queries). Contexts are gathered from the pages and padded to the longest; padded positions point at the
  sequence's own first slot (finite data, whatever the rest of the cache holds) and are masked out;
* prefill chunks run one call each: with nothing cached before them (``query_len == seq_len``) straight on the
  step's new K/V with ``is_causal``; after a cached prefix, on the gathered context with an offset causal mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cinq.kernels.cpu_native import paged_decode_native
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.paged import causal_mask, gather_context


def sdpa_paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                         meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """[T, Hq, D] output of one serving step (see ``cinq.kernels.backends`` for the contract)."""
    out = torch.empty_like(query) if out is None else out
    nd = meta.num_decodes
    if nd:
        out[:nd] = sdpa_decode(query[:nd], kv_cache, meta, scale)
    if meta.num_seqs == nd:
        return out
    starts = meta.query_start_loc.tolist()
    for i in range(nd, meta.num_seqs):
        s, e = starts[i], starts[i + 1]
        q_len, seq_len = e - s, meta.seq_lens_cpu[i]
        q = query[s:e].transpose(0, 1).unsqueeze(0)  # [1, Hq, q, D]
        if q_len == seq_len:  # nothing cached before: the new K/V are the whole context
            k = key[s:e].transpose(0, 1).unsqueeze(0).to(q.dtype)
            v = value[s:e].transpose(0, 1).unsqueeze(0).to(q.dtype)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:
            k, v = gather_context(kv_cache, meta.block_tables[i], seq_len)
            mask = causal_mask(q_len, seq_len, query.device)
            o = F.scaled_dot_product_attention(q, k.transpose(0, 1).unsqueeze(0).to(q.dtype),
                                               v.transpose(0, 1).unsqueeze(0).to(q.dtype),
                                               attn_mask=mask, scale=scale, enable_gqa=True)
        out[s:e] = o[0].transpose(0, 1)
    return out


def sdpa_decode(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
    """Decodes of the first ``query.shape[0]`` sequences: [nd, Hq, D]. On the CPU the native kernel reads the
    pages directly (no gathered copy of the contexts); elsewhere, or if it cannot be built, one SDPA call."""
    native = paged_decode_native(query, kv_cache, meta.block_tables, meta.seq_lens, scale)
    if native is not None:
        return native
    nd, hq, d = query.shape
    _, num_blocks, block_size, hkv, _ = kv_cache.shape
    nblocks = -(-max(meta.seq_lens_cpu[:nd]) // block_size)
    pos = torch.arange(nblocks * block_size, device=query.device)
    valid = pos[None, :] < meta.seq_lens[:nd, None]  # [nd, L]
    tables = meta.block_tables[:nd, :nblocks].long()
    slots = (tables[:, :, None] * block_size + torch.arange(block_size, device=query.device)).flatten(1)
    slots = torch.where(valid, slots, slots[:, :1])  # padding reads the sequence's own token 0, then is masked
    kv = kv_cache.view(2, num_blocks * block_size, hkv, d)[:, slots]  # [2, nd, L, Hkv, D]: one gather
    k = kv[0].transpose(1, 2).to(query.dtype)  # [nd, Hkv, L, D]
    v = kv[1].transpose(1, 2).to(query.dtype)
    q = query.reshape(nd, hkv, hq // hkv, d)  # GQA group as query rows
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=scale)
    return o.reshape(nd, hq, d)
