"""AttentionMetadata: what one forward step needs to know to read and write the paged KV cache.

A step is a flat, variable-length batch of T new tokens from B sequences. Sequence i owns the new tokens
``query_start_loc[i]:query_start_loc[i+1]``; they sit at the last ``query_len`` positions of a context of
``seq_lens[i]`` tokens whose K/V live in the blocks ``block_tables[i]``. Decode-like sequences come first: the
first ``num_decodes`` each have exactly ``decode_query_len`` new tokens (1 for plain decoding, k + 1 when a
speculative step verifies k draft tokens), so backends batch them in their decode kernel, causal within those
rows; the rest are (chunked) prefills.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cinq.errors import InvalidParameterError


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step attention inputs, shared by every layer of the forward pass."""

    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset where each new token's K/V is stored
    query_start_loc: torch.Tensor  # [B + 1] int32, cumulative query lengths (cu_seqlens_q)
    seq_lens: torch.Tensor  # [B] int32, context length after this step (cached + new tokens)
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0 past a sequence's last block
    query_lens_cpu: list[int]  # host copies: backends branch on them without device syncs
    seq_lens_cpu: list[int]
    num_decodes: int  # the first num_decodes sequences have query_len == decode_query_len
    max_query_len: int
    max_seq_len: int
    block_size: int
    decode_query_len: int = 1  # query rows of each decode-like sequence

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes * self.decode_query_len

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @classmethod
    def from_lens(cls, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]], block_size: int,
                  device: torch.device | str = "cpu", decode_query_len: int = 1) -> AttentionMetadata:
        """Build the metadata of one step from host lists (tests, benchmarks, simple callers).

        Sequences must already be ordered decodes first; ``num_decodes`` counts the leading sequences with
        ``query_len == decode_query_len``.
        """
        if not isinstance(decode_query_len, int) or decode_query_len < 1:
            raise InvalidParameterError(
                f"metadata: decode_query_len must be an integer >= 1, got {decode_query_len!r}",
                param="decode_query_len")
        if not (len(query_lens) == len(seq_lens) == len(block_tables)):
            raise InvalidParameterError(
                f"metadata: query_lens ({len(query_lens)}), seq_lens ({len(seq_lens)}) and block_tables "
                f"({len(block_tables)}) must have one entry per sequence", param="query_lens")
        slots: list[int] = []
        for q_len, s_len, table in zip(query_lens, seq_lens, block_tables):
            if not 0 < q_len <= s_len or -(-s_len // block_size) > len(table):
                raise InvalidParameterError(
                    f"metadata: need 0 < query_len ({q_len}) <= seq_len ({s_len}) <= {len(table)} blocks x "
                    f"{block_size}", param="seq_lens")
            slots += [table[p // block_size] * block_size + p % block_size for p in range(s_len - q_len, s_len)]
        width = max((len(t) for t in block_tables), default=0)
        padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
        starts = [0]
        for q_len in query_lens:
            starts.append(starts[-1] + q_len)
        num_decodes = 0
        while num_decodes < len(query_lens) and query_lens[num_decodes] == decode_query_len:
            num_decodes += 1
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=device).view(len(block_tables), width),
            query_lens_cpu=list(query_lens),
            seq_lens_cpu=list(seq_lens),
            num_decodes=num_decodes,
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
            block_size=block_size,
            decode_query_len=decode_query_len,
        )
