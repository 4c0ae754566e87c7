"""The loader/layer contract: lazily read checkpoint tensors, output shards, and the default sharded loader."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from cinq.errors import ModelLoadError
from cinq.layers.weight_loader import CheckpointTensor, OutputShards, ParamLayout, load_sharded, split_shards


def test_checkpoint_tensor_reads_only_the_narrowed_rows():
    t = torch.arange(24.0).reshape(6, 4)
    reads = []

    def read(index):
        reads.append(index)
        return t if index is None else t[index]

    lazy = CheckpointTensor("w", (6, 4), read)
    part = lazy.narrow(0, 2, 3).narrow(1, 1, 2)
    assert part.shape == (3, 2) and not reads
    assert torch.equal(part.load(), t[2:5, 1:3]) and reads == [(slice(2, 5), slice(1, 3))]


def test_checkpoint_tensor_narrows_a_safetensors_file_lazily(tmp_path):
    t = torch.arange(40.0).reshape(8, 5)
    save_file({"w": t}, tmp_path / "x.safetensors")
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as f:
        lazy = CheckpointTensor.from_safetensors(f, "w")
        assert lazy.shape == (8, 5)
        assert torch.equal(lazy.narrow(0, 3, 4).load(), t[3:7])
        assert torch.equal(lazy.narrow(1, 1, 2).narrow(0, 6, 2).load(), t[6:8, 1:3])
        assert torch.equal(lazy.load(), t)


def test_packed_shards_load_whole_words_and_split_back():
    shards = OutputShards(("q", "k"), (16, 8))
    layout = ParamLayout(output_dim=1, pack=8)  # AWQ qweight: 8 output channels per int32 word
    dst = torch.zeros(4, 3, dtype=torch.int32)
    parts = {"q": torch.full((4, 2), 7, dtype=torch.int32), "k": torch.full((4, 1), 9, dtype=torch.int32)}
    for s, t in parts.items():
        load_sharded(dst, CheckpointTensor.in_memory(f"{s}.qweight", t), layout, shards, s, "qk")
    assert dst[:, :2].eq(7).all() and dst[:, 2].eq(9).all()
    back = split_shards(dst, layout, shards)
    assert torch.equal(back["q"], parts["q"]) and torch.equal(back["k"], parts["k"])
    odd = OutputShards(("q", "k"), (12, 12))  # 12 channels do not fill whole words of 8
    with pytest.raises(ModelLoadError, match="whole packed words"):
        load_sharded(dst, CheckpointTensor.in_memory("k.qweight", parts["k"]), layout, odd, "k", "qk")
