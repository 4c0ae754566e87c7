"""Attention over the virtual-contiguous KV cache (``kv_cache_layout="virtual"``, cinq/engine/kv_cache_virtual.py).

Per layer the cache is ``[2, num_slots, slot_tokens, Hkv, D]``; sequence i owns slot ``meta.block_tables[i, 0]``
(its one-entry "block table") and its context is the plain view ``kv_cache[:, slot, :seq_len]``. So:

* decodes: ``contiguous_decode.cpp`` on the CPU, walking each sequence's K and V ranges with a pointer (no block
  lookup per token); elsewhere, or without the native build, SDPA per sequence on the views;
* prefill chunks: SDPA straight on the step's K/V (nothing cached before) or on the view of the context (after a
  cached prefix): no gather copy, which the paged path needs;
* K/V writes: the paged writer, unchanged: ``slot * slot_tokens + position`` is the flat slot.

On CUDA the Triton kernels of the paged layout serve this layout as they are (block size = slot_tokens, one table
entry: every tile then reads one contiguous run); tests run them on the virtual views with ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cinq.kernels.cpu_native import _int32, decode_attention_native, write_kv_native
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.paged import causal_mask, check_inputs, write_kv_index_copy


def contiguous_decode_native(query: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
                             seq_lens: torch.Tensor, scale: float, query_len: int = 1) -> torch.Tensor | None:
    """[nd * query_len, Hq, D] decode attention read straight from each sequence's contiguous range, or None when
    the native kernel is unavailable (not CPU, no build)."""
    return decode_attention_native("contiguous_decode", query, kv_cache, lambda mod, q: mod.contiguous_decode(
        q, kv_cache, _int32(slots), _int32(seq_lens), float(scale), int(query_len)))


def contiguous_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                         meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """[T, Hq, D] output of one step over the contiguous layout (the backends' contract, cinq.kernels.backends)."""
    if meta.tree_mask is not None:
        raise ValueError("kv_cache_layout virtual: tree verification steps are not supported")
    out = torch.empty_like(query) if out is None else out
    nd, ql = meta.num_decodes, meta.decode_query_len
    slots = meta.block_tables[:, 0]
    starts = meta.query_start_loc.tolist()
    if nd:
        nt = meta.num_decode_tokens
        native = contiguous_decode_native(query[:nt], kv_cache, slots, meta.seq_lens, scale, ql)
        if native is not None:
            out[:nt] = native
        else:
            for i in range(nd):
                _attend_view(query, kv_cache, int(slots[i]), starts[i], starts[i + 1], meta.seq_lens_cpu[i],
                             scale, out)
    for i in range(nd, meta.num_seqs):
        s, e = starts[i], starts[i + 1]
        if e - s == meta.seq_lens_cpu[i]:  # nothing cached before: the new K/V are the whole context
            q = query[s:e].transpose(0, 1).unsqueeze(0)
            k = key[s:e].transpose(0, 1).unsqueeze(0).to(q.dtype)
            v = value[s:e].transpose(0, 1).unsqueeze(0).to(q.dtype)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
            out[s:e] = o[0].transpose(0, 1)
        else:
            _attend_view(query, kv_cache, int(slots[i]), s, e, meta.seq_lens_cpu[i], scale, out)
    return out


def _attend_view(query: torch.Tensor, kv_cache: torch.Tensor, slot: int, s: int, e: int, seq_len: int,
                 scale: float, out: torch.Tensor) -> None:
    """Rows s..e-1 (the last e - s positions of a seq_len context) attend to the slot's view, causally."""
    q = query[s:e].transpose(0, 1).unsqueeze(0)  # [1, Hq, q, D]
    k = kv_cache[0, slot, :seq_len].transpose(0, 1).unsqueeze(0).to(q.dtype)  # a view: no gather
    v = kv_cache[1, slot, :seq_len].transpose(0, 1).unsqueeze(0).to(q.dtype)
    mask = causal_mask(e - s, seq_len, query.device)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    out[s:e] = o[0].transpose(0, 1)


class ContiguousBackend:
    """Backend ``"contiguous"``: the virtual layout's attention (CPU; the torch fallback runs anywhere)."""

    name = "contiguous"

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        if not write_kv_native(key, value, kv_cache, slot_mapping):
            write_kv_index_copy(key, value, kv_cache, slot_mapping)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        check_inputs(query, kv_cache, meta, key, value, out)
        return contiguous_attention(query, key, value, kv_cache, meta, scale, out)
