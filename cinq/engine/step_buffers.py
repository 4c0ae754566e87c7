"""StepBuffers: the persistent, preallocated inputs of a decode step of a fixed batch size (token ids, positions,
slot mapping, block tables, sequence lengths) and the one AttentionMetadata over them, updated in place each step.

A compiled step (torch.compile, cinq/engine/compiled_decode.py) and a CUDA graph (cinq/engine/cuda_graph.py) both
run over the same tensors every step: the graph reads them by address, and the compiled code sees the same shapes
and the same metadata object, so nothing in it guards on a step's host values. ``fill`` is the whole per-step input
cost: the step validated once (not per layer), its values written as two host lists, two copies into the buffers
(one host-to-device transfer each on a GPU). Rows past the step's sequences are padding: one-token decodes of
position 0 on the runner's scratch block, whose logits nobody reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cinq.kernels.metadata import AttentionMetadata
from cinq.step.scheduler_output import ScheduledSeq


@dataclass(slots=True)
class StepBuffers:
    """Inputs of a decode step of ``size`` one-token rows, tables ``table_width`` blocks wide. ``input_ids``,
    ``positions`` and ``meta``'s tensors are views of two buffers (int64 and int32) written by ``fill``."""

    size: int
    block_size: int
    table_width: int
    pad_block_id: int
    input_ids: torch.Tensor  # [size] int64
    positions: torch.Tensor  # [size] int64
    meta: AttentionMetadata
    _i64: torch.Tensor  # [3, size]: input ids, positions, slots
    _i32: torch.Tensor  # [size, 1 + table_width]: seq len, then the block table row

    @classmethod
    def allocate(cls, size: int, block_size: int, table_width: int, pad_block_id: int,
                 device: torch.device) -> StepBuffers:
        """Zeroed buffers on ``device``, their metadata describing ``size`` decodes."""
        i64 = torch.zeros(3, size, dtype=torch.long, device=device)
        i32 = torch.zeros(size, 1 + table_width, dtype=torch.int32, device=device)
        meta = AttentionMetadata(
            slot_mapping=i64[2], query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=device),
            seq_lens=i32[:, 0], block_tables=i32[:, 1:], query_lens_cpu=[1] * size, seq_lens_cpu=[1] * size,
            num_decodes=size, max_query_len=1, max_seq_len=1, block_size=block_size, decode_query_len=1)
        return cls(size, block_size, table_width, pad_block_id, i64[0], i64[1], meta, i64, i32)

    @property
    def capacity(self) -> int:
        """The longest context a row can have: every block of its table."""
        return self.table_width * self.block_size

    def fill(self, seqs: list[ScheduledSeq]) -> None:
        """Write ``seqs`` (one-token decodes, in row order) into the buffers, padding rows after them; the
        metadata's host copies (``seq_lens_cpu``, ``max_seq_len``) follow, for eager readers."""
        self.check(seqs)
        bs, width = self.block_size, self.table_width
        pad = self.size - len(seqs)
        ids = [s.token_ids[0] for s in seqs] + [0] * pad
        pos = [s.start_pos for s in seqs] + [0] * pad
        slots = [s.block_ids[p // bs] * bs + p % bs for s, p in zip(seqs, pos)] + [self.pad_block_id * bs] * pad
        seq_lens = [p + 1 for p in pos]
        rows: list[int] = []
        for s, n in zip(seqs, seq_lens):
            rows.append(n)
            rows.extend(s.block_ids)
            rows.extend([0] * (width - len(s.block_ids)))
        rows.extend([1, self.pad_block_id, *[0] * (width - 1)] * pad)
        # host tensors pinned on a GPU: the copies are then asynchronous, ordered before the step on the stream
        pin = self._i64.device.type == "cuda"
        self._i64.copy_(torch.tensor([ids, pos, slots], dtype=torch.long, pin_memory=pin), non_blocking=pin)
        self._i32.copy_(torch.tensor(rows, dtype=torch.int32, pin_memory=pin).view(self.size, 1 + width),
                        non_blocking=pin)
        self.meta.seq_lens_cpu[:] = seq_lens
        self.meta.max_seq_len = max(seq_lens)
        self.meta.checked_inputs = None  # a new step: the first layer checks it again

    def check(self, seqs: list[ScheduledSeq]) -> None:
        """Raise ValueError unless ``seqs`` fit: at most ``size`` one-token decodes, each table within the width
        and covering its position (the runner's own invariants: a failure here is a bug, not bad user input)."""
        if len(seqs) > self.size:
            raise ValueError(f"step buffers: {len(seqs)} sequences do not fit a decode step of size {self.size}")
        for s in seqs:
            if len(s.token_ids) != 1 or s.num_draft_slots:
                raise ValueError(f"step buffers: {s.request_id} is not a one-token decode ({len(s.token_ids)} "
                                 f"tokens, {s.num_draft_slots} draft slots)")
            if not s.start_pos // self.block_size < len(s.block_ids) <= self.table_width:
                raise ValueError(f"step buffers: {s.request_id} at position {s.start_pos} has {len(s.block_ids)} "
                                 f"blocks of {self.block_size}; the tables hold {self.table_width}")
