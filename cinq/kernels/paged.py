"""The paged KV cache as attention kernels see it: layout helpers and the validation every backend shares.

Layout per layer: ``kv_cache[2, num_blocks, block_size, Hkv, D]`` (index 0 = keys, 1 = values). Token ``t`` of a
sequence lives in block ``block_table[t // block_size]`` at offset ``t % block_size``; its flat *slot* is
``block * block_size + offset``. The helpers here are torch-native and run on any device.
"""

from __future__ import annotations

import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def write_kv_index_copy(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                        slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V rows ([T, Hkv, D]) into the flat view of the paged cache at ``slot_mapping`` ([T])."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    flat[0].index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    flat[1].index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def context_slots(block_table: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """Flat slots [seq_len] (int64) of a sequence's tokens 0..seq_len-1, read through its block table."""
    nblocks = -(-seq_len // block_size)
    offsets = torch.arange(block_size, device=block_table.device)
    return (block_table[:nblocks].long()[:, None] * block_size + offsets).flatten()[:seq_len]


def gather_context(kv_cache: torch.Tensor, block_table: torch.Tensor,
                   seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one sequence's first ``seq_len`` tokens, [seq_len, Hkv, D] each, read through its block table."""
    block_size = kv_cache.shape[2]
    nblocks = -(-seq_len // block_size)
    kv = kv_cache[:, block_table[:nblocks].long()]  # [2, nblocks, block_size, Hkv, D]
    kv = kv.flatten(1, 2)[:, :seq_len]
    return kv[0], kv[1]


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Boolean mask [q_len, kv_len]: query i (at position kv_len - q_len + i) sees keys 0..that position."""
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=kv_len - q_len)


def window_mask(q_len: int, kv_len: int, window: int, device: torch.device) -> torch.Tensor:
    """Boolean mask [q_len, kv_len] of a sliding window: query i (at position kv_len - q_len + i) sees keys at
    positions > that position - window (AND it with the causal or tree mask)."""
    pos = torch.arange(kv_len - q_len, kv_len, device=device)
    return torch.arange(kv_len, device=device)[None, :] > pos[:, None] - window


def tree_context_mask(tree_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Boolean mask [q, kv_len] of q tree rows that are the last q of kv_len keys: every row sees the cached
    context (keys 0..kv_len - q - 1), and of the tree rows those ``tree_mask`` [q, q] (one sequence's) lets it
    see."""
    q = tree_mask.shape[0]
    context = torch.ones(q, kv_len - q, dtype=torch.bool, device=tree_mask.device)
    return torch.cat([context, tree_mask], dim=1)


def check_inputs(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                 key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> None:
    """Raise a clear error for shapes or dtypes no backend can take; once per step (the metadata remembers the
    inputs it accepted: every layer passes the same shapes). Skipped while torch.compile traces the runner's
    decode step: its inputs are the runner's own, and every host value read here (max_seq_len grows each step)
    would become a guard, a recompile per step."""
    if torch.compiler.is_compiling():
        return
    signature = (query.shape, query.dtype, query.device, kv_cache.shape, kv_cache.dtype,
                 None if key is None else key.shape, None if value is None else value.shape,
                 None if out is None else (out.shape, out.dtype, out.device))
    if meta.checked_inputs == signature:  # an earlier layer of this step passed the same inputs
        return
    _check_inputs(query, kv_cache, meta, key, value, out)
    meta.checked_inputs = signature


def _check_inputs(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, key: torch.Tensor | None,
                  value: torch.Tensor | None, out: torch.Tensor | None) -> None:
    if query.dim() != 3:
        raise InvalidParameterError(
            f"attention: query must be [tokens, heads, head_dim], got shape {tuple(query.shape)}", param="query")
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise InvalidParameterError(
            f"attention: kv_cache must be [2, num_blocks, block_size, kv_heads, head_dim], got {tuple(kv_cache.shape)}",
            param="kv_cache")
    if query.shape[-1] != kv_cache.shape[-1]:
        raise InvalidParameterError(
            f"attention: head_dim of query ({query.shape[-1]}) and kv_cache ({kv_cache.shape[-1]}) differ",
            param="query")
    if query.shape[1] % kv_cache.shape[3]:
        raise InvalidParameterError(
            f"attention: query heads ({query.shape[1]}) must be a multiple of kv heads ({kv_cache.shape[3]})",
            param="query")
    if query.shape[0] != meta.num_tokens:
        raise InvalidParameterError(
            f"attention: query has {query.shape[0]} tokens but the metadata describes {meta.num_tokens}",
            param="query")
    for name, t in (("query", query), ("kv_cache", kv_cache)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise InvalidParameterError(
                f"attention: {name} dtype must be one of {[str(d) for d in SUPPORTED_DTYPES]}, got {t.dtype}",
                param=name)
    if kv_cache.shape[2] != meta.block_size:
        raise InvalidParameterError(
            f"attention: kv_cache block_size ({kv_cache.shape[2]}) differs from the metadata's ({meta.block_size})",
            param="block_size")
    if meta.query_start_loc.shape[0] != meta.num_seqs + 1 or len(meta.query_lens_cpu) != meta.num_seqs:
        raise InvalidParameterError(
            f"attention: metadata describes {meta.num_seqs} sequences but query_start_loc has "
            f"{meta.query_start_loc.shape[0]} entries (need num_seqs + 1) and query_lens_cpu "
            f"{len(meta.query_lens_cpu)}",
            param="query_start_loc")
    if meta.decode_query_len < 1 or meta.num_decode_tokens > query.shape[0]:
        raise InvalidParameterError(
            f"attention: {meta.num_decodes} decode-like sequences of {meta.decode_query_len} query rows each do "
            f"not fit in {query.shape[0]} tokens", param="decode_query_len")
    tree = meta.tree_mask
    if tree is not None:
        ql, nd = meta.decode_query_len, meta.num_decodes
        if tuple(tree.shape) not in ((ql, ql), (nd, ql, ql)) or tree.dtype != torch.bool or tree.device != query.device:
            raise InvalidParameterError(
                f"attention: tree_mask must be bool [{ql}, {ql}] (shared) or [{nd}, {ql}, {ql}] (per decode-like "
                f"sequence) on {query.device}, got {tree.dtype} {list(tree.shape)} on {tree.device}",
                param="tree_mask")
    if meta.block_tables.dim() != 2 or meta.block_tables.shape[0] < meta.num_seqs:
        raise InvalidParameterError(
            f"attention: block_tables must be [num_seqs >= {meta.num_seqs}, max_blocks], "
            f"got {tuple(meta.block_tables.shape)}", param="block_tables")
    if meta.max_seq_len > meta.block_tables.shape[1] * meta.block_size:
        raise InvalidParameterError(
            f"attention: max_seq_len {meta.max_seq_len} exceeds what block_tables address "
            f"({meta.block_tables.shape[1]} blocks x {meta.block_size})", param="max_seq_len")
    for name, t in (("key", key), ("value", value)):
        if t is not None and (t.dim() != 3 or t.shape[0] != query.shape[0] or t.shape[1:] != kv_cache.shape[3:]):
            raise InvalidParameterError(
                f"attention: {name} must be [{query.shape[0]}, {kv_cache.shape[3]}, {kv_cache.shape[4]}] "
                f"(tokens, kv heads, head_dim), got {tuple(t.shape)}", param=name)
    if out is not None and (out.shape != query.shape or out.dtype != query.dtype or out.device != query.device):
        raise InvalidParameterError(
            f"attention: out must match query ({tuple(query.shape)}, {query.dtype}, {query.device}), "
            f"got ({tuple(out.shape)}, {out.dtype}, {out.device})", param="out")
