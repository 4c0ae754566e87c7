"""Attention layer: stores the step's K/V in the paged cache and calls the active backend.

Without metadata (training, perplexity, calibration) it is plain causal attention over a [batch, seq] block.
A layer with a sliding window (Gemma 3's local layers) hands it to the backend in the step's metadata
(``AttentionMetadata.sliding_window``: the metadata is shared by every layer, the window is the layer's).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from cinq.kernels.backends import AttentionBackend, get_backend
from cinq.kernels.metadata import AttentionMetadata


class Attention(nn.Module):
    """Multi-head attention core (no projections): GQA, paged KV cache, pluggable backend."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 backend: str = "sdpa", sliding_window: int | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.backend: AttentionBackend = get_backend(backend)
        # a query at position p sees keys at positions > p - sliding_window (HF / llama.cpp); None: all of them
        self.sliding_window = sliding_window
        # [2, num_blocks, block_size, num_kv_heads, head_dim]; bound by the model runner when it allocates the cache.
        self.kv_cache: torch.Tensor | None = None
        # its KV cache group (cinq/engine/kv_cache_groups.py), set by the runner when the model has several
        self.kv_group = 0

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata | None) -> torch.Tensor:
        """q: [..., Hq, D]; k, v: [..., Hkv, D]. Flat [T, H, D] with metadata, [B, S, H, D] without."""
        if meta is None:
            mask = None
            if self.sliding_window is not None and q.shape[-3] > self.sliding_window:
                i = torch.arange(q.shape[-3], device=q.device)
                mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - self.sliding_window)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                               enable_gqa=True)
            return o.transpose(1, 2)
        if self.kv_cache is None:
            raise RuntimeError("attention: KV cache not allocated (the model runner binds it before the first step)")
        if self.kv_group and meta.group_block_tables is not None:  # its group's own tables and slots
            meta = dataclasses.replace(meta, sliding_window=self.sliding_window,
                                       block_tables=meta.group_block_tables[self.kv_group],
                                       slot_mapping=meta.group_slot_mapping[self.kv_group])
        elif self.sliding_window is not None:  # the step's metadata is every layer's: a windowed layer gets a copy
            meta = dataclasses.replace(meta, sliding_window=self.sliding_window)
        self.backend.write_kv(k, v, self.kv_cache, meta.slot_mapping)
        return self.backend.forward(q, k, v, self.kv_cache, meta, self.scale)
