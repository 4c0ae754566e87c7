"""One rank's part of a checkpoint linear under tensor parallelism (Megatron's column / row split).

* column-parallel (QKV, gate/up, the LM head): the rank holds some output channels of every shard; ``starts``
  says where, in the checkpoint tensor, each shard's part begins (for QKV with fewer KV heads than ranks the K/V
  parts of several ranks start at the same head: replicated);
* row-parallel (o_proj, down_proj): the rank holds input channels [in_start, in_start + in_size) and a partial
  sum of the output, which one all-reduce completes; the bias is added once, by rank 0.

A layer narrows each ``CheckpointTensor`` with ``narrow`` before loading it, so only the rank's slice is read
from the safetensors file. Where a tensor's channels lie comes from its ``ParamLayout``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cinq.errors import ModelLoadError
from cinq.layers.weight_loader import CheckpointTensor, OutputShards, ParamLayout, ShardId

COLUMN = "column"
ROW = "row"


@dataclass(slots=True, frozen=True)
class LinearSplit:
    """This rank's part of a linear: ``parallel`` is ``COLUMN`` or ``ROW``; ``rank`` of ``size`` ranks."""

    parallel: str
    rank: int
    size: int
    # column: (shard id, first checkpoint output channel of this rank's part); shard id None: an unmerged linear
    starts: tuple[tuple[ShardId | None, int], ...] = ()
    in_start: int = 0  # row: this rank's input channels
    in_size: int = 0

    def narrow(self, loaded: CheckpointTensor, layout: ParamLayout, shard_id: ShardId | None,
               shards: OutputShards | None, out_features: int, prefix: str = "") -> CheckpointTensor:
        """The part of checkpoint tensor ``loaded`` this rank loads (still unread). ``shards`` / ``out_features``:
        the layer's own (per-rank) output layout."""
        if self.parallel == COLUMN:
            if layout.output_dim is None:
                return loaded  # shared by every output channel (GPTQ's g_idx): whole on every rank
            starts = dict(self.starts)
            if shard_id not in starts:
                raise ModelLoadError(f"checkpoint tensor '{loaded.name}': {prefix} has no tensor-parallel part for "
                                     f"shard {shard_id!r}")
            size = out_features if shard_id is None or shards is None else shards.span(shard_id, prefix)[1]
            return _narrow(loaded, layout.output_dim, starts[shard_id], size, layout.pack, prefix)
        if layout.input_dim is None:
            return loaded
        return _narrow(loaded, layout.input_dim, self.in_start, self.in_size, layout.input_pack, prefix)

    def keeps_bias(self) -> bool:
        """Row-parallel partial sums would add the bias once per rank: only rank 0 keeps it."""
        return self.parallel == COLUMN or self.rank == 0


def _narrow(loaded: CheckpointTensor, dim: int, start: int, size: int, pack: int, prefix: str) -> CheckpointTensor:
    if start % pack or size % pack:
        raise ModelLoadError(f"checkpoint tensor '{loaded.name}': the tensor-parallel slice of {prefix} ({size} "
                             f"channels at {start}) does not fill whole stored elements of {pack} channels; use a "
                             f"tensor_parallel_size that divides the layer into such units", "tensor_parallel_size")
    return loaded.narrow(dim, start // pack, size // pack)


def column_split(rank: int, size: int, starts: dict[ShardId | None, int]) -> LinearSplit:
    """A column-parallel split whose shards' parts begin at ``starts`` in the checkpoint tensors."""
    return LinearSplit(COLUMN, rank, size, tuple(starts.items()))


def row_split(rank: int, size: int, in_features: int) -> LinearSplit:
    """A row-parallel split of ``in_features`` (the whole layer's) into ``size`` equal parts."""
    part = in_features // size
    return LinearSplit(ROW, rank, size, in_start=rank * part, in_size=part)
