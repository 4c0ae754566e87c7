"""build_batch: decode-like sequences first, bucket padding on scratch blocks, and tree groups (ancestor masks,
positions by depth, slots in row order)."""

from __future__ import annotations

import random

import torch

from cinq.kernels.metadata import AttentionMetadata
from cinq.step.batch_inputs import PAD_ID, RAGGED_MAX_ROWS, TreeGroup, build_batch, decode_query_len, prepare_inputs
from cinq.step.scheduler_output import ScheduledSeq

BS = 4
PAD_BLOCKS = [90, 91]


def test_decodes_come_first_and_padding_rounds_the_rows_up() -> None:
    seqs = [ScheduledSeq("prefill", list(range(37)), 0, list(range(10, 20)), 1),
            ScheduledSeq("a", [5], 9, [2, 3, 4], 1), ScheduledSeq("b", [6], 3, [5], 1)]
    b = build_batch(seqs, BS, PAD_BLOCKS, torch.device("cpu"))
    assert [s.request_id for s in b.seqs] == ["a", "b", "prefill"]
    assert b.meta.num_decodes == 2 and b.meta.decode_query_len == 1
    assert b.starts == [0, 1, 2, 39]
    assert b.last_rows() == [0, 1, 38]
    assert b.input_ids.shape[0] == 40 and b.meta.seq_lens_cpu[-1] == 1  # one padding row, on its own blocks
    assert b.positions[:9].tolist() == [9, 3, 0, 1, 2, 3, 4, 5, 6]
    assert b.meta.slot_mapping[:2].tolist() == [4 * BS + 1, 5 * BS + 3]  # position 9 in block 4, 3 in block 5
    assert int(b.meta.slot_mapping[39]) // BS in PAD_BLOCKS and PAD_ID not in [s.request_id for s in b.seqs]
    # up to EXACT_ROWS rows no padding: 17 one-token decodes stay 17 decode-like sequences
    decodes = [ScheduledSeq(str(i), [5], 9, [2, 3, 4], 1) for i in range(17)]
    small = build_batch(decodes, BS, PAD_BLOCKS, torch.device("cpu")).meta
    assert small.num_seqs == small.num_decodes == 17 and small.slot_mapping.shape[0] == 17


def test_decode_query_len_is_the_most_common_verify_length() -> None:
    seqs = [ScheduledSeq(str(i), [1] * q, 5, [0, 1], q) for i, q in enumerate([4, 4, 1, 2, 2, 2])]
    assert decode_query_len(seqs) == 2
    assert decode_query_len([ScheduledSeq("p", [1] * 8, 0, [0, 1], 1)]) == 1  # no decode-like sequence


def test_a_step_of_verifies_of_several_lengths_is_ragged_one_with_a_prompt_chunk_is_not() -> None:
    # requests verifying 3, 0 and 1 drafts: every sequence is decode-like, so the CPU
    # kernels attend all of them from the pages (ragged_decodes); a prompt chunk, or a verify past
    # RAGGED_MAX_ROWS rows, keeps the chunk path
    verify = [ScheduledSeq("a", [1] * 4, 8, [2, 3, 4], 4), ScheduledSeq("b", [6], 3, [5], 1),
              ScheduledSeq("c", [7, 8], 5, [6, 7], 2)]
    b = build_batch(verify, BS, PAD_BLOCKS, torch.device("cpu"))
    assert b.meta.num_decodes < b.meta.num_seqs and b.meta.ragged_decodes
    prompt = ScheduledSeq("p", list(range(7)), 0, [0, 1], 1)
    assert not build_batch([*verify, prompt], BS, PAD_BLOCKS, torch.device("cpu")).meta.ragged_decodes
    long = ScheduledSeq("l", [1] * (RAGGED_MAX_ROWS + 1), 40, list(range(20, 40)), RAGGED_MAX_ROWS + 1)
    assert not build_batch([*verify, long], BS, PAD_BLOCKS, torch.device("cpu")).meta.ragged_decodes
    uniform = build_batch(verify[:1], BS, PAD_BLOCKS, torch.device("cpu")).meta
    assert uniform.num_decodes == uniform.num_seqs and not uniform.ragged_decodes


def test_a_tree_group_gets_masks_depth_positions_and_row_order_slots() -> None:
    parents_a, parents_b = [-1, 0, 0, 1], [-1, 0, 1, 1]
    seqs = [ScheduledSeq("plain", [3], 6, [7, 8], 1), ScheduledSeq("a", [1, 2, 3, 4], 8, [0, 1, 2], 4),
            ScheduledSeq("b", [5, 6, 7, 8], 4, [3, 4], 4)]
    b = build_batch(seqs, BS, PAD_BLOCKS, torch.device("cpu"), tree=TreeGroup({"a": parents_a, "b": parents_b}))
    assert [s.request_id for s in b.seqs] == ["a", "b", "plain"]
    assert b.meta.num_decodes == 2 and b.meta.decode_query_len == 4
    assert b.meta.tree_mask.shape == (2, 4, 4)  # two shapes: one mask each
    assert b.meta.tree_mask[0].tolist() == [[True, False, False, False], [True, True, False, False],
                                            [True, False, True, False], [True, True, False, True]]
    assert b.positions[:8].tolist() == [8, 9, 9, 10, 4, 5, 6, 6]  # start + depth
    assert b.meta.slot_mapping[:4].tolist() == [2 * BS + 0, 2 * BS + 1, 2 * BS + 2, 2 * BS + 3]  # rows 8..11
    same = build_batch(seqs, BS, PAD_BLOCKS, torch.device("cpu"), tree=TreeGroup({"a": parents_a, "b": parents_a}))
    assert same.meta.tree_mask.shape == (4, 4)  # one shape: the shared form


def test_prepare_inputs_matches_metadata_built_token_by_token() -> None:
    """Chunks that start mid-block, span several blocks and end on a block edge, decodes, a one-block prompt:
    the range-built slots and positions equal the per-token definition (AttentionMetadata.from_lens)."""
    rng = random.Random(0)
    bs = 4
    seqs = [ScheduledSeq("d0", [5], 9, [7, 3, 11], 1), ScheduledSeq("d1", [6], 0, [2], 1),
            ScheduledSeq("p0", list(range(10)), 3, [4, 9, 1, 0], 1),  # starts mid-block, ends on a block edge
            ScheduledSeq("p1", list(range(3)), 0, [8], 1)]
    for i in range(3):  # random chunks over shuffled blocks
        start, n = rng.randrange(0, 40), rng.randrange(1, 30)
        blocks = rng.sample(range(20, 80), -(-(start + n) // bs))
        seqs.append(ScheduledSeq(f"r{i}", [rng.randrange(100) for _ in range(n)], start, blocks, 1))
    meta, ids, positions = prepare_inputs(seqs, 1, bs, torch.device("cpu"))
    ref = AttentionMetadata.from_lens([len(s.token_ids) for s in seqs],
                                      [s.start_pos + len(s.token_ids) for s in seqs], [s.block_ids for s in seqs], bs)
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
        got, want = getattr(meta, name), getattr(ref, name)
        assert got.dtype == want.dtype and torch.equal(got, want), name
    assert meta.num_decodes == ref.num_decodes == 2
    assert ids.tolist() == [t for s in seqs for t in s.token_ids]
    assert positions.tolist() == [s.start_pos + j for s in seqs for j in range(len(s.token_ids))]
