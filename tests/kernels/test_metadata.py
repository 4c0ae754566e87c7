from __future__ import annotations

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata


def test_from_lens_slots_follow_block_tables() -> None:
    # seq 0: decode at position 20 (block 1 of its table); seq 1: chunk of 3 after 2 cached tokens; seq 2: prompt
    meta = AttentionMetadata.from_lens([1, 3, 2], [21, 5, 2], [[7, 2], [4], [9, 0]], block_size=16)
    assert meta.slot_mapping.tolist() == [2 * 16 + 4, 4 * 16 + 2, 4 * 16 + 3, 4 * 16 + 4, 9 * 16 + 0, 9 * 16 + 1]
    assert meta.query_start_loc.tolist() == [0, 1, 4, 6]
    assert meta.seq_lens.tolist() == [21, 5, 2]
    assert meta.block_tables.tolist() == [[7, 2], [4, 0], [9, 0]]
    assert meta.num_decodes == 1
    assert (meta.num_seqs, meta.num_tokens, meta.max_query_len, meta.max_seq_len) == (3, 6, 3, 21)
    assert meta.slot_mapping.dtype == torch.int64 and meta.block_tables.dtype == torch.int32


def test_num_decodes_counts_only_leading_single_tokens() -> None:
    meta = AttentionMetadata.from_lens([1, 1, 4, 1], [3, 9, 4, 1], [[0], [1], [2], [3]], block_size=16)
    assert meta.num_decodes == 2


@pytest.mark.parametrize("query_lens,seq_lens,tables", [
    ([2], [1], [[0]]),  # more new tokens than context
    ([0], [4], [[0]]),  # empty query
    ([1], [40], [[0, 1]]),  # context needs 3 blocks of 16
    ([1, 1], [3], [[0]]),  # list lengths differ
])
def test_from_lens_rejects_inconsistent_lengths(query_lens: list[int], seq_lens: list[int],
                                                tables: list[list[int]]) -> None:
    with pytest.raises(InvalidParameterError):
        AttentionMetadata.from_lens(query_lens, seq_lens, tables, block_size=16)
