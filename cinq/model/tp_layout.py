"""How a Llama-family decoder divides over ``N`` tensor-parallel ranks (Megatron's layout).

Attention heads split evenly; KV heads split too when there are at least ``N`` of them, and are replicated
otherwise (rank r then uses KV head ``r * num_kv_heads // N``, the one its query heads read). The MLP's
intermediate channels split evenly. QKV and gate/up are column-parallel, o_proj and down_proj row-parallel, the
embedding and LM head vocabulary-parallel (cinq/layers/vocab_parallel.py). The KV cache follows the heads: every
rank holds its own KV heads of every block, so all ranks share one set of block tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from cinq.distributed.parallel_state import TPShard
from cinq.errors import InvalidParameterError
from cinq.layers.linear_split import LinearSplit, column_split, row_split
from cinq.layers.weight_loader import ShardId
from cinq.model.config import ModelConfig


def check_divisible(config: ModelConfig, size: int) -> None:
    """Refuse a ``tensor_parallel_size`` the model cannot be divided by (InvalidParameterError naming it)."""
    problems = config.tensor_parallel_problems(size)
    if problems:
        raise InvalidParameterError(f"tensor_parallel_size {size} does not divide the model's "
                                    f"{' or its '.join(problems)}", "tensor_parallel_size")


@dataclass(slots=True, frozen=True)
class TPLayout:
    """One rank's share of the decoder's layers."""

    shard: TPShard
    num_heads: int
    num_kv_heads: int
    kv_head_start: int  # the first checkpoint KV head this rank holds
    head_dim: int
    intermediate_size: int

    @classmethod
    def of(cls, config: ModelConfig, shard: TPShard) -> TPLayout:
        check_divisible(config, shard.size)
        n, kv = shard.size, config.num_key_value_heads
        local_kv = max(1, kv // n)
        kv_start = shard.rank * local_kv if kv >= n else shard.rank * kv // n
        return cls(shard, config.num_attention_heads // n, local_kv, kv_start, config.head_dim,
                   config.intermediate_size // n)

    @property
    def sharded(self) -> bool:
        return self.shard.size > 1

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def _column(self, starts: dict[ShardId | None, int]) -> LinearSplit | None:
        return column_split(self.shard.rank, self.shard.size, starts) if self.sharded else None

    def qkv_split(self, shard_ids: tuple[str, ...] = ("q", "k", "v")) -> LinearSplit | None:
        """Column split of the QKV projection (merged ids "q"/"k"/"v", or one of them alone)."""
        starts = {"q": self.shard.rank * self.q_size, "k": self.kv_head_start * self.head_dim}
        starts["v"] = starts["k"]
        return self._column({i: starts[i] for i in shard_ids})

    def proj_split(self, name: str) -> LinearSplit | None:
        """Column split of one unmerged q/k/v projection (its checkpoint tensor is whole: shard id None)."""
        split = self.qkv_split((name,))
        return None if split is None else column_split(split.rank, split.size, {None: split.starts[0][1]})

    def mlp_split(self, shard_ids: tuple[int | None, ...] = (0, 1)) -> LinearSplit | None:
        """Column split of gate/up (merged ids 0/1; (None,): one of them alone)."""
        return self._column({i: self.shard.rank * self.intermediate_size for i in shard_ids})

    def row(self, in_features: int) -> LinearSplit | None:
        """Row split of o_proj / down_proj over their whole ``in_features``."""
        return row_split(self.shard.rank, self.shard.size, in_features) if self.sharded else None
