"""Vocabulary-parallel embedding and LM head (tensor parallelism): each rank holds ``ceil(V / N)`` rows of the
vocabulary, rank r the rows from ``r * ceil(V / N)`` on (the last rank's tail past V is zero padding).

The embedding looks up the ids that fall in its rows, zeroes the others and all-reduces, so every rank ends up
with the full embedding. The LM head computes its rows' logits and all-gathers them, so every rank holds the
same full ``[.., V]`` logits (and samples the same tokens). With a tied embedding both hold the same rows, so the
head shares the embedding's shard. Models built for one device use ``nn.Embedding`` / ``DenseLinear`` instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cinq.distributed.parallel_state import TPShard, all_gather_last_dim, all_reduce, current_shard
from cinq.layers.linear import DenseLinear
from cinq.layers.weight_loader import CheckpointTensor, ShardId, check_and_copy


def vocab_rows(vocab_size: int, shard: TPShard) -> tuple[int, int]:
    """(first vocabulary row, rows per rank) of ``shard``."""
    per_rank = -(-vocab_size // shard.size)
    return shard.rank * per_rank, per_rank


def load_vocab_rows(dst: torch.Tensor, loaded: CheckpointTensor, start: int, vocab_size: int) -> None:
    """Fill ``dst`` [rows, H] with the checkpoint's vocabulary rows from ``start`` (read alone); zero padding past
    the vocabulary."""
    valid = max(0, min(dst.shape[0], vocab_size - start))
    if loaded.shape[0] != vocab_size:
        check_and_copy(dst, loaded)  # names the shape mismatch
    if valid:
        check_and_copy(dst.narrow(0, 0, valid), loaded.narrow(0, start, valid))
    with torch.no_grad():
        dst[valid:].zero_()


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the token embedding; the lookup all-reduces over the group."""

    def __init__(self, vocab_size: int, hidden_size: int, shard: TPShard) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.shard = shard
        self.vocab_start, rows = vocab_rows(vocab_size, shard)
        self.weight = nn.Parameter(torch.empty(rows, hidden_size))

    def weight_loader(self, name: str, loaded: CheckpointTensor, shard_id: ShardId | None = None) -> None:
        load_vocab_rows(self.weight, loaded, self.vocab_start, self.vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill(outside.unsqueeze(-1), 0))

    def extra_repr(self) -> str:
        return (f"rows {self.vocab_start}..{self.vocab_start + self.weight.shape[0]} of {self.vocab_size}, "
                f"rank {self.shard.rank}/{self.shard.size}")


def token_embedding(vocab_size: int, hidden_size: int) -> nn.Module:
    """The token embedding a model builds: ``nn.Embedding`` on one device, this rank's rows under tensor
    parallelism (``current_shard()`` at construction)."""
    shard = current_shard()
    if shard.size == 1:
        return nn.Embedding(vocab_size, hidden_size)
    return VocabParallelEmbedding(vocab_size, hidden_size, shard)


class ParallelLMHead(DenseLinear):
    """This rank's rows of the LM head; its output is every rank's logits gathered, ``[.., vocab_size]``."""

    def __init__(self, hidden_size: int, vocab_size: int, shard: TPShard) -> None:
        start, rows = vocab_rows(vocab_size, shard)
        super().__init__(hidden_size, rows, False, prefix="lm_head")
        self.vocab_start = start
        self.vocab_size = vocab_size
        self.shard = shard

    def weight_loader(self, name: str, loaded: CheckpointTensor, shard_id: ShardId | None = None) -> None:
        load_vocab_rows(self.weight, loaded, self.vocab_start, self.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last_dim(super().forward(x), self.shard.size)[..., :self.vocab_size]
