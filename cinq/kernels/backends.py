"""Attention backends: one interface, several implementations chosen by name.

Every backend takes the same inputs and returns the same outputs:

* ``write_kv(key, value, kv_cache, slot_mapping)`` stores the step's new K/V ([T, Hkv, D]) into the paged cache
  ``kv_cache`` ([2, num_blocks, block_size, Hkv, D]) at the flat slots of ``slot_mapping``.
* ``forward(query, key, value, kv_cache, meta, scale)`` returns [T, Hq, D]: each new token attends causally to
  its whole context read through the block tables (the new tokens' K/V are already in the cache).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    """What an attention implementation provides to the Attention layer."""

    name: str

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None: ...

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor: ...


def write_kv_index_copy(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                        slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V rows into the flat view of the paged cache (torch-native; any device)."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    flat[0].index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    flat[1].index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def gather_context(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one sequence's first ``seq_len`` tokens, [seq_len, Hkv, D] each, read through its block table."""
    block_size = kv_cache.shape[2]
    nblocks = -(-seq_len // block_size)
    kv = kv_cache[:, block_table[:nblocks].long()]  # [2, nblocks, block_size, Hkv, D]
    kv = kv.flatten(1, 2)[:, :seq_len]
    return kv[0], kv[1]


def check_inputs(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> None:
    """Raise a clear error for shapes or dtypes no backend can take."""
    if query.dim() != 3:
        raise InvalidParameterError(f"attention: query must be [tokens, heads, head_dim], got shape {tuple(query.shape)}")
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise InvalidParameterError(
            f"attention: kv_cache must be [2, num_blocks, block_size, kv_heads, head_dim], got {tuple(kv_cache.shape)}")
    if query.shape[-1] != kv_cache.shape[-1]:
        raise InvalidParameterError(
            f"attention: head_dim of query ({query.shape[-1]}) and kv_cache ({kv_cache.shape[-1]}) differ")
    if query.shape[1] % kv_cache.shape[3]:
        raise InvalidParameterError(
            f"attention: query heads ({query.shape[1]}) must be a multiple of kv heads ({kv_cache.shape[3]})")
    if query.shape[0] != meta.num_tokens:
        raise InvalidParameterError(
            f"attention: query has {query.shape[0]} tokens but the metadata describes {meta.num_tokens}")
    if not query.is_floating_point():
        raise InvalidParameterError(f"attention: query dtype must be floating point, got {query.dtype}")


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Boolean mask [q_len, kv_len]: query i (at position kv_len - q_len + i) sees keys 0..that position."""
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=kv_len - q_len)


class SdpaBackend:
    """CPU default: ``scaled_dot_product_attention`` (it dispatches to PyTorch's flash CPU kernel).

    Decodes are batched into one call over contexts padded to the longest; prefills run one call per sequence
    (their cost is compute, so the per-sequence loop is not the bottleneck).
    """

    name = "sdpa"

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        write_kv_index_copy(key, value, kv_cache, slot_mapping)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        check_inputs(query, kv_cache, meta)
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(query[:nd], kv_cache, meta, scale)
        starts = meta.query_start_loc.tolist() if meta.num_seqs > nd else []
        for i in range(nd, meta.num_seqs):
            s, e = starts[i], starts[i + 1]
            q_len, seq_len = e - s, meta.seq_lens_cpu[i]
            q = query[s:e].transpose(0, 1)  # [Hq, q, D]
            if q_len == seq_len:  # nothing cached before: the new K/V are the whole context
                k, v = key[s:e], value[s:e]
                o = F.scaled_dot_product_attention(q, k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                                   scale=scale, enable_gqa=True)
            else:
                k, v = gather_context(kv_cache, meta.block_tables[i], seq_len)
                mask = causal_mask(q_len, seq_len, query.device)
                o = F.scaled_dot_product_attention(q, k.transpose(0, 1).to(q.dtype), v.transpose(0, 1).to(q.dtype),
                                                   attn_mask=mask, scale=scale, enable_gqa=True)
            out[s:e] = o.transpose(0, 1)
        return out

    @staticmethod
    def _decode(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
        nd = query.shape[0]
        block_size = kv_cache.shape[2]
        max_len = max(meta.seq_lens_cpu[:nd])
        nblocks = -(-max_len // block_size)
        tables = meta.block_tables[:nd, :nblocks].long()
        kv = kv_cache[:, tables].flatten(2, 3)  # [2, nd, L, Hkv, D]
        k = kv[0].transpose(1, 2).to(query.dtype)  # [nd, Hkv, L, D]
        v = kv[1].transpose(1, 2).to(query.dtype)
        pos = torch.arange(k.shape[2], device=query.device)
        mask = (pos[None, :] < meta.seq_lens[:nd, None]).view(nd, 1, 1, -1)
        q = query.unsqueeze(2)  # [nd, Hq, 1, D]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        return o.squeeze(2)


class ReferenceBackend:
    """Naive attention with the score matrix materialised in float64: the ground truth for tests."""

    name = "reference"

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        write_kv_index_copy(key, value, kv_cache, slot_mapping)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        check_inputs(query, kv_cache, meta)
        out = torch.empty_like(query)
        starts = meta.query_start_loc.tolist()
        group = query.shape[1] // kv_cache.shape[3]
        for i in range(meta.num_seqs):
            s, e = starts[i], starts[i + 1]
            k, v = gather_context(kv_cache, meta.block_tables[i], meta.seq_lens_cpu[i])
            k = k.double().repeat_interleave(group, dim=1)  # [L, Hq, D]
            v = v.double().repeat_interleave(group, dim=1)
            q = query[s:e].double()
            scores = torch.einsum("qhd,khd->hqk", q, k) * scale
            mask = causal_mask(e - s, k.shape[0], query.device)
            scores = scores.masked_fill(~mask, float("-inf"))
            out[s:e] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(query.dtype)
        return out


_REGISTRY: dict[str, Callable[[], AttentionBackend]] = {
    "sdpa": SdpaBackend,
    "reference": ReferenceBackend,
}


def register_backend(name: str, factory: Callable[[], AttentionBackend]) -> None:
    """Make a backend selectable by name (``EngineConfig.attention_backend``)."""
    _REGISTRY[name] = factory


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str) -> AttentionBackend:
    """Instantiate the backend registered under ``name``; unknown names list the choices."""
    if name not in _REGISTRY:
        raise InvalidParameterError(
            f"attention_backend: unknown backend {name!r}; choose one of {available_backends()}",
            param="attention_backend")
    return _REGISTRY[name]()


def default_backend_name(device: torch.device | str) -> str:
    """``triton`` on CUDA when registered, else ``sdpa``."""
    if torch.device(device).type == "cuda" and "triton" in _REGISTRY:
        return "triton"
    return "sdpa"
