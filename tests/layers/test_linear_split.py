"""A tensor-parallel rank reads only its slice of each checkpoint tensor, and its layer computes its part."""

from __future__ import annotations

import torch

from cinq.distributed.parallel_state import TPShard
from cinq.layers.linear import DenseLinear
from cinq.layers.linear_split import column_split, row_split
from cinq.layers.vocab_parallel import load_vocab_rows, vocab_rows
from cinq.layers.weight_loader import CheckpointTensor, OutputShards


def recording(name: str, t: torch.Tensor, reads: list) -> CheckpointTensor:
    def read(index):
        reads.append(index)
        return t if index is None else t[index]
    return CheckpointTensor(name, tuple(t.shape), read)


def test_column_split_of_a_merged_projection_reads_each_shards_rows():
    torch.manual_seed(0)
    q, k = torch.randn(8, 4), torch.randn(4, 4)
    reads: list = []
    # rank 1 of 2: q rows 4..8, k rows 2..4 of the checkpoint
    layer = DenseLinear(4, 6, output_shards=OutputShards(("q", "k"), (4, 2)),
                        split=column_split(1, 2, {"q": 4, "k": 2}))
    layer.weight_loader("weight", recording("q_proj.weight", q, reads), "q")
    layer.weight_loader("weight", recording("k_proj.weight", k, reads), "k")
    assert torch.equal(layer.weight, torch.cat([q[4:], k[2:]]))
    assert reads == [(slice(4, 8), slice(0, 4)), (slice(2, 4), slice(0, 4))]  # the slices only


def test_row_split_parts_sum_to_the_whole_and_the_bias_is_added_once():
    torch.manual_seed(0)
    w, b, x = torch.randn(3, 8), torch.randn(3), torch.randn(2, 8)
    total = torch.zeros(2, 3)
    for rank in range(2):
        layer = DenseLinear(4, 3, bias=True, split=row_split(rank, 2, 8))
        layer.weight_loader("weight", CheckpointTensor.in_memory("w", w))
        layer.weight_loader("bias", CheckpointTensor.in_memory("b", b))
        with torch.no_grad():
            total += layer(x[:, rank * 4:(rank + 1) * 4])
    torch.testing.assert_close(total, x @ w.T + b)


def test_vocab_rows_pad_the_last_rank():
    emb = torch.randn(5, 2)
    assert [vocab_rows(5, TPShard(r, 2)) for r in range(2)] == [(0, 3), (3, 3)]
    dst = torch.full((3, 2), 7.0)
    load_vocab_rows(dst, CheckpointTensor.in_memory("e", emb), 3, 5)
    assert torch.equal(dst[:2], emb[3:]) and torch.equal(dst[2], torch.zeros(2))
