"""StepBuffers: a decode step's inputs written in place into preallocated tensors, padded to the size."""

from __future__ import annotations

import pytest
import torch

from cinq.engine.step_buffers import StepBuffers
from cinq.step.scheduler_output import ScheduledSeq

BS, WIDTH, PAD = 4, 3, 9


def seq(rid: str, token: int, pos: int, blocks: list[int]) -> ScheduledSeq:
    return ScheduledSeq(rid, [token], pos, blocks, 1)


def test_fill_writes_the_step_and_pads_in_place():
    b = StepBuffers.allocate(4, BS, WIDTH, PAD, torch.device("cpu"))
    tensors = [b.input_ids, b.positions, b.meta.slot_mapping, b.meta.seq_lens, b.meta.block_tables]
    addresses = [t.data_ptr() for t in tensors]
    b.fill([seq("a", 11, 5, [7, 2]), seq("b", 12, 0, [3])])
    assert b.input_ids.tolist() == [11, 12, 0, 0]
    assert b.positions.tolist() == [5, 0, 0, 0]
    # position 5 is offset 1 of the second block (2): slot 2 * 4 + 1; padding rows write the scratch block
    assert b.meta.slot_mapping.tolist() == [9, 12, PAD * BS, PAD * BS]
    assert b.meta.seq_lens.tolist() == [6, 1, 1, 1]
    assert b.meta.block_tables.tolist() == [[7, 2, 0], [3, 0, 0], [PAD, 0, 0], [PAD, 0, 0]]
    assert b.meta.seq_lens_cpu == [6, 1, 1, 1] and b.meta.max_seq_len == 6
    assert b.meta.num_decodes == 4 and b.meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    b.fill([seq("b", 13, 1, [3])])  # the next step: same tensors, new values
    assert [t.data_ptr() for t in tensors] == addresses
    assert b.input_ids.tolist() == [13, 0, 0, 0] and b.meta.slot_mapping.tolist() == [13, PAD * BS, PAD * BS,
                                                                                       PAD * BS]
    assert b.meta.block_tables.tolist()[0] == [3, 0, 0]  # the old row's second block is cleared


@pytest.mark.parametrize("bad, what", [
    ([seq(f"r{i}", 1, 0, [1]) for i in range(3)], "do not fit"),
    ([ScheduledSeq("p", [1, 2], 0, [1], 1)], "not a one-token decode"),
    ([seq("w", 1, 0, [1, 2, 3, 4])], "tables hold 3"),
    ([seq("s", 1, 4, [1])], "position 4"),  # position 4 needs a second block
])
def test_fill_refuses_what_does_not_fit(bad, what):
    b = StepBuffers.allocate(2, BS, WIDTH, PAD, torch.device("cpu"))
    with pytest.raises(ValueError, match=what):
        b.fill(bad)
