"""``LinearBase`` (vLLM's name): what every linear kind, dense or quantized, holds and does alike: its sizes,
checkpoint name, merged output shards and tensor-parallel split, and the loading steps that follow from them
(narrowing a checkpoint tensor to this rank's part; dropping the bias on the ranks that must not add it)."""

from __future__ import annotations

from torch import nn

from cinq.errors import ModelLoadError
from cinq.layers.linear_split import LinearSplit
from cinq.layers.weight_loader import CheckpointTensor, OutputShards, ParamLayout, ShardId


class LinearBase(nn.Module):
    """y = x W^T (+ b) over ``in_features`` -> ``out_features`` (this rank's sizes under ``split``); with
    ``output_shards`` a merged projection whose rows are the shards' in order."""

    def __init__(self, in_features: int, out_features: int, prefix: str = "",
                 output_shards: OutputShards | None = None, split: LinearSplit | None = None) -> None:
        super().__init__()
        if output_shards is not None and output_shards.total != out_features:
            raise ModelLoadError(f"{prefix}: shards {output_shards.sizes} do not add up to out_features "
                                 f"{out_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.prefix = prefix
        self.output_shards = output_shards
        self.split = split

    def rank_part(self, loaded: CheckpointTensor, layout: ParamLayout, shard_id: ShardId | None) -> CheckpointTensor:
        """The part of checkpoint tensor ``loaded`` this rank loads (the whole tensor without a split)."""
        if self.split is None:
            return loaded
        return self.split.narrow(loaded, layout, shard_id, self.output_shards, self.out_features, self.prefix)

    def drops_bias(self, name: str) -> bool:
        """True when ``name`` is the bias and this rank's partial sums must not add it (row-parallel, rank > 0)."""
        return name == "bias" and self.split is not None and not self.split.keeps_bias()
