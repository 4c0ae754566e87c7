"""AttentionMetadata: what one forward step needs to know to read and write the paged KV cache.

A step is a flat, variable-length batch of T new tokens from B sequences. Sequence i owns the new tokens
``query_start_loc[i]:query_start_loc[i+1]``; they sit at the last ``query_len`` positions of a context of
``seq_lens[i]`` tokens whose K/V live in the blocks ``block_tables[i]``. Decodes (exactly one new token) come
first, so backends can batch them and treat the rest as (chunked) prefills.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step attention inputs, shared by every layer of the forward pass."""

    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset where each new token's K/V is stored
    query_start_loc: torch.Tensor  # [B + 1] int32, cumulative query lengths (cu_seqlens_q)
    seq_lens: torch.Tensor  # [B] int32, context length after this step (cached + new tokens)
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0 past a sequence's last block
    query_lens_cpu: list[int]  # host copies: backends branch on them without device syncs
    seq_lens_cpu: list[int]
    num_decodes: int  # the first num_decodes sequences have query_len == 1
    max_query_len: int
    max_seq_len: int
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])
