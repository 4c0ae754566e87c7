"""LinearBase: the geometry and tensor-parallel loading steps that the dense and the quantized linears share
(each kind's loading is tested in tests/layers/test_linear.py and tests/layers/quantization/)."""

from __future__ import annotations

import pytest

from cinq.errors import ModelLoadError
from cinq.layers.linear_base import LinearBase
from cinq.layers.linear_split import column_split, row_split
from cinq.layers.weight_loader import OutputShards, ParamLayout


def test_merged_shards_must_add_up_to_the_output_size():
    with pytest.raises(ModelLoadError, match="qkv_proj: shards .* do not add up to out_features 10"):
        LinearBase(4, 10, "qkv_proj", OutputShards(("q", "k"), (4, 4)))


class _Tensor:
    """A checkpoint tensor stand-in that records how it was narrowed."""

    name = "w"

    def __init__(self, narrowed: tuple[int, int, int] | None = None) -> None:
        self.narrowed = narrowed

    def narrow(self, dim: int, start: int, length: int) -> _Tensor:
        return _Tensor((dim, start, length))


def test_rank_part_is_the_whole_tensor_without_a_split_and_this_ranks_rows_with_one():
    layout = ParamLayout(output_dim=0, input_dim=1)
    t = _Tensor()
    assert LinearBase(8, 4).rank_part(t, layout, None) is t  # type: ignore[arg-type]
    part = LinearBase(8, 4, split=column_split(1, 2, {None: 4})).rank_part(t, layout, None)  # type: ignore[arg-type]
    assert part.narrowed == (0, 4, 4)
    part = LinearBase(4, 8, split=row_split(1, 2, 8)).rank_part(t, layout, None)  # type: ignore[arg-type]
    assert part.narrowed == (1, 4, 4)


@pytest.mark.parametrize("split,drops", [(None, False), (column_split(1, 2, {None: 4}), False),
                                         (row_split(0, 2, 8), False), (row_split(1, 2, 8), True)])
def test_only_row_parallel_ranks_after_the_first_drop_the_bias(split, drops):
    layer = LinearBase(4, 4, split=split)
    assert layer.drops_bias("bias") is drops
    assert layer.drops_bias("weight") is False
