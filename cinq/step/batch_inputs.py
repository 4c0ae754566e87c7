"""One step's flat varlen inputs: scheduled sequences -> (AttentionMetadata, input ids, positions).

The target runner and every model-based proposer (a draft model, an EAGLE head) run forwards over the same paged
block tables, so they build their inputs here, once: decode-like sequences first (the decode kernel batches
them), a padding sequence on scratch blocks rounding the rows up to a GEMM-shape bucket, then one tensor per input
built from host lists (no per-token Python arithmetic): positions as one range per sequence, slots as one range
per block touched.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from cinq.kernels.metadata import AttentionMetadata, depths, tree_mask_from_parents, tree_masks_from_parents
from cinq.step.scheduler_output import ScheduledSeq
from cinq.step.shape_buckets import bucket_rows

# The most query rows of a decode-like sequence outside the step's decode group that the CPU kernels attend from the
# pages (a verify of up to 31 drafts); longer chunks take the backends' chunk path (SDPA over a gathered context).
RAGGED_MAX_ROWS = 32
PAD_ID = "\x00pad"  # the padding sequence's id: no request has it, no state, never sampled


@dataclass(slots=True)
class BatchInputs:
    """A step ready for ``model(input_ids, positions, meta)``; ``seqs`` in the order of the rows (no padding),
    ``starts[i]:starts[i + 1]`` the rows of ``seqs[i]``."""

    seqs: list[ScheduledSeq]
    meta: AttentionMetadata
    input_ids: torch.Tensor
    positions: torch.Tensor
    starts: list[int]

    def last_rows(self) -> list[int]:
        """The row of each sequence's last token."""
        return [self.starts[i + 1] - 1 for i in range(len(self.seqs))]


def decode_query_len(seqs: list[ScheduledSeq]) -> int:
    """The query length the decode kernel batches this step: the most common one among decode-like sequences
    (every row produces logits: plain decodes, 1; speculative verifies, k + 1), the shorter on a tie; 1 if none.
    The rest take the backends' chunk path, which is exact for any sequence too."""
    counts: dict[int, int] = {}
    for s in seqs:
        if s.num_logit_rows == len(s.token_ids):
            counts[s.num_logit_rows] = counts.get(s.num_logit_rows, 0) + 1
    return min(counts, key=lambda q: (-counts[q], q)) if counts else 1


@dataclass(slots=True)
class TreeGroup:
    """Sequences verified (or drafted) as one flattened tree each, all with the same number of rows: they form the
    step's decode group, attend with their tree's ancestor mask, and each row sits one position past its parent
    (``parents[request_id]``: row 0 the root, parents first)."""

    parents: dict[str, list[int]]


def build_batch(seqs: list[ScheduledSeq], block_size: int, pad_block_ids: list[int], device: torch.device,
                ql: int | None = None, tree: TreeGroup | None = None, decode_batch: int | None = None,
                table_width: int = 0) -> BatchInputs:
    """Order ``seqs`` (decode-like of length ``ql`` first; default: ``decode_query_len``; with ``tree``: its
    sequences), pad, build inputs.

    ``decode_batch`` (one-token decodes only, the compiled step): pad with one-token decodes on the scratch blocks
    to that many sequences instead of bucketing rows; ``table_width``: block tables at least that wide. Together
    they give every step of a batch size the same tensor shapes."""
    if tree is not None:
        ql = len(next(iter(tree.parents.values())))
        ordered = sorted(seqs, key=lambda s: s.request_id not in tree.parents)
    else:
        ql = decode_query_len(seqs) if ql is None else ql
        ordered = sorted(seqs, key=lambda s: len(s.token_ids) != ql)
    if decode_batch is not None:
        padded = ordered + [ScheduledSeq(PAD_ID, [0], 0, pad_block_ids[:1], 0)] * (decode_batch - len(ordered))
    else:
        num_tokens = sum(len(s.token_ids) for s in ordered)
        pad = bucket_rows(num_tokens) - num_tokens
        padded = ordered + [ScheduledSeq(PAD_ID, [0] * pad, 0, pad_block_ids, 0)] if pad else ordered
    meta, input_ids, positions = prepare_inputs(padded, ql, block_size, device, table_width)
    if tree is not None:
        _apply_tree(tree, ordered[:len(tree.parents)], meta, positions, device)
    starts = [0, *itertools.accumulate(len(s.token_ids) for s in ordered)]
    return BatchInputs(ordered, meta, input_ids, positions, starts)


def _apply_tree(tree: TreeGroup, seqs: list[ScheduledSeq], meta: AttentionMetadata, positions: torch.Tensor,
                device: torch.device) -> None:
    """The decode group's ancestor masks (one shared mask when every tree has the same shape) and positions by
    depth (slots stay in row order: row r of a tree at slot start + r)."""
    order = [tree.parents[s.request_id] for s in seqs]
    meta.num_decodes = len(order)
    if all(p == order[0] for p in order):
        meta.tree_mask = tree_mask_from_parents(order[0], device)
    else:
        meta.tree_mask = tree_masks_from_parents(order, device)
    q = len(order[0])
    depth = torch.tensor([d for p in order for d in depths(p)], device=device)
    start = torch.tensor([s.start_pos for s in seqs], device=device).repeat_interleave(q)
    positions[:len(order) * q] = start + depth


def prepare_inputs(seqs: list[ScheduledSeq], ql: int, block_size: int, device: torch.device, table_width: int = 0
                   ) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor]:
    """Metadata, input ids and positions of ``seqs`` as ordered (decode-like of length ``ql`` first).

    Built as host lists, one tensor each at the end: per-token values come from ``range`` expansions per
    sequence (positions) and per block (slots), so there is no per-token Python arithmetic, and a decode step
    costs a few tensor constructions instead of ~25 small ATen ops."""
    q_lens = [len(s.token_ids) for s in seqs]
    seq_lens = [s.start_pos + n for s, n in zip(seqs, q_lens)]
    positions: list[int] = []
    slots: list[int] = []
    for s, end in zip(seqs, seq_lens):
        positions.extend(range(s.start_pos, end))
        slots.extend(_slots(s.block_ids, s.start_pos, end, block_size))
    width = max(table_width, *(len(s.block_ids) for s in seqs))
    tables = [list(s.block_ids) + [0] * (width - len(s.block_ids)) for s in seqs]
    num_decodes = next((i for i, n in enumerate(q_lens) if n != ql), len(q_lens))
    ragged = num_decodes < len(seqs) and max(q_lens) <= RAGGED_MAX_ROWS and all(
        s.num_logit_rows == len(s.token_ids) or s.request_id == PAD_ID for s in seqs[num_decodes:])
    i64, i32 = torch.long, torch.int32
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=i64, device=device),
        query_start_loc=torch.tensor([0, *itertools.accumulate(q_lens)], dtype=i32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=i32, device=device),
        block_tables=torch.tensor(tables, dtype=i32, device=device),
        query_lens_cpu=q_lens, seq_lens_cpu=seq_lens, num_decodes=num_decodes,
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_size=block_size,
        decode_query_len=ql, ragged_decodes=ragged)
    input_ids = torch.tensor(list(itertools.chain.from_iterable(s.token_ids for s in seqs)), dtype=i64,
                             device=device)
    return meta, input_ids, torch.tensor(positions, dtype=i64, device=device)


def _slots(block_ids: list[int], start: int, end: int, block_size: int) -> range | itertools.chain[int]:
    """Flat cache slots of positions start..end-1: one contiguous range per block they touch."""
    first, last = start // block_size, (end - 1) // block_size
    if first == last:  # the common case (every decode): one block
        base = block_ids[first] * block_size - first * block_size
        return range(base + start, base + end)
    return itertools.chain.from_iterable(
        range(block_ids[b] * block_size + max(start - b * block_size, 0),
              block_ids[b] * block_size + min(end - b * block_size, block_size))
        for b in range(first, last + 1))
