from __future__ import annotations

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata, check_tree_mask, tree_mask_from_parents, tree_masks_from_parents


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


def test_tree_mask_from_parents_marks_ancestors() -> None:
    mask = tree_mask_from_parents([-1, 0, 0, 1, 2, 3])
    assert mask.dtype == torch.bool and mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],  # a sibling of row 1: does not see it
        [1, 1, 0, 1, 0, 0],
        [1, 0, 1, 0, 1, 0],
        [1, 1, 0, 1, 0, 1],
    ]
    assert torch.equal(tree_mask_from_parents([-1, 0, 1, 2]), torch.ones(4, 4, dtype=torch.bool).tril())  # chain
    with pytest.raises(InvalidParameterError, match="parents") as err:
        tree_mask_from_parents([-1, 0, 2])  # a parent that is not earlier
    assert err.value.param == "parents"


def test_from_lens_takes_a_tree_mask_and_defaults_to_none() -> None:
    assert AttentionMetadata.from_lens([3], [9], [[0]], 16, decode_query_len=3).tree_mask is None
    mask = tree_mask_from_parents([-1, 0, 0])
    meta = AttentionMetadata.from_lens([3, 3, 1], [9, 3, 4], [[0], [1], [2]], 16, decode_query_len=3,
                                       tree_mask=mask)
    assert meta.num_decodes == 2 and torch.equal(meta.tree_mask, mask)


@pytest.mark.parametrize("mask,why", [
    (torch.ones(3, 3, dtype=torch.bool).tril()[:2], r"\[3, 3\]"),  # wrong shape
    (torch.ones(2, 2, dtype=torch.bool).tril(), r"\[3, 3\]"),  # another query length's mask
    (torch.ones(3, 3).tril(), "bool"),  # not bool
    ([[True, False, False], [True, True, False], [True, True, True]], "bool"),  # not a tensor
    (torch.tensor([[1, 0, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool), "diagonal"),  # row 1 does not see itself
    (torch.ones(3, 3, dtype=torch.bool), "above the diagonal"),  # row 0 sees later rows
])
def test_from_lens_rejects_bad_tree_masks(mask, why: str) -> None:
    with pytest.raises(InvalidParameterError, match=why) as err:
        AttentionMetadata.from_lens([3], [9], [[0]], 16, decode_query_len=3, tree_mask=mask)
    assert err.value.param == "tree_mask" and "tree_mask" in str(err.value)


def test_tree_masks_from_parents_stacks_one_tree_per_sequence() -> None:
    trees = [[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 0, 0]]
    masks = tree_masks_from_parents(trees)
    assert masks.shape == (3, 4, 4) and masks.dtype == torch.bool
    for s, parents in enumerate(trees):
        assert torch.equal(masks[s], tree_mask_from_parents(parents))
    for bad in ([[-1, 0], [-1, 0, 0]], []):  # lengths differ; no tree at all
        with pytest.raises(InvalidParameterError, match="parents") as err:
            tree_masks_from_parents(bad)
        assert err.value.param == "parents"
    with pytest.raises(InvalidParameterError, match="parents"):
        tree_masks_from_parents([[-1, 0, 0], [-1, 2, 0]])  # the second tree's parent is not earlier


def test_from_lens_takes_a_per_sequence_tree_mask() -> None:
    masks = tree_masks_from_parents([[-1, 0, 0], [-1, 0, 1]])
    meta = AttentionMetadata.from_lens([3, 3, 1], [9, 3, 4], [[0], [1], [2]], 16, decode_query_len=3,
                                       tree_mask=masks)
    assert meta.num_decodes == 2 and torch.equal(meta.tree_mask, masks)
    assert torch.equal(meta.seq_tree_mask(1), masks[1]) and meta.seq_tree_mask(2) is None  # 2: a prefill
    shared = AttentionMetadata.from_lens([3, 3], [9, 3], [[0], [1]], 16, decode_query_len=3, tree_mask=masks[0])
    assert shared.seq_tree_mask(1) is shared.tree_mask


def _per_seq(*slices: list[list[int]]) -> torch.Tensor:
    return torch.tensor(slices, dtype=torch.bool)


CHAIN = [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


@pytest.mark.parametrize("mask,why", [
    (tree_masks_from_parents([[-1, 0, 0]] * 3), r"\[2, 3, 3\], got \[3, 3, 3\]"),  # a slice per decode: 2, not 3
    (tree_masks_from_parents([[-1, 0, 0]]), r"\[2, 3, 3\], got \[1, 3, 3\]"),
    (torch.ones(2, 2, 2, dtype=torch.bool).tril(), r"\[3, 3\]"),  # another query length
    (torch.ones(1, 2, 3, 3, dtype=torch.bool).tril(), r"\[3, 3\]"),  # 4-D
    (_per_seq(CHAIN, [[1, 0, 0], [1, 0, 0], [1, 1, 1]]), r"diagonal.*sequence 1"),
    (_per_seq([[1, 0, 1], [1, 1, 0], [1, 1, 1]], CHAIN), r"above the diagonal.*sequence 0"),
])
def test_from_lens_rejects_bad_per_sequence_tree_masks(mask: torch.Tensor, why: str) -> None:
    with pytest.raises(InvalidParameterError, match=why) as err:
        AttentionMetadata.from_lens([3, 3, 5], [9, 3, 5], [[0], [1], [2]], 16, decode_query_len=3, tree_mask=mask)
    assert err.value.param == "tree_mask" and "tree_mask" in str(err.value)


def test_check_tree_mask_without_a_sequence_count_takes_any_number_of_slices() -> None:
    check_tree_mask(tree_masks_from_parents([[-1, 0]] * 5), 2)
    check_tree_mask(tree_mask_from_parents([-1, 0]), 2, num_decodes=7)  # the shared form fits any count
    with pytest.raises(InvalidParameterError, match="tree_mask"):
        check_tree_mask(tree_masks_from_parents([[-1, 0]] * 5), 2, num_decodes=4)
