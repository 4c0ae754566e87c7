"""How the decoder divides over tensor-parallel ranks: heads, replicated KV heads, refusals."""

from __future__ import annotations

import pytest

from cinq.distributed.parallel_state import TPShard
from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.model.tp_layout import TPLayout, check_divisible


def config(heads: int = 8, kv: int = 2, inter: int = 128, head_dim: int = 16) -> ModelConfig:
    return ModelConfig("LlamaForCausalLM", 100, heads * head_dim, inter, 2, heads, kv, head_dim, 64)


def test_kv_heads_split_when_there_are_enough():
    layouts = [TPLayout.of(config(kv=4), TPShard(r, 2)) for r in range(2)]
    assert [(t.num_heads, t.num_kv_heads, t.kv_head_start) for t in layouts] == [(4, 2, 0), (4, 2, 2)]
    assert [t.qkv_split().starts for t in layouts] == [(("q", 0), ("k", 0), ("v", 0)),
                                                         (("q", 64), ("k", 32), ("v", 32))]


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    # 2 KV heads over 4 ranks: ranks 0-1 read KV head 0 (their query heads 0-3), ranks 2-3 KV head 1
    layouts = [TPLayout.of(config(kv=2), TPShard(r, 4)) for r in range(4)]
    assert [t.num_kv_heads for t in layouts] == [1, 1, 1, 1]
    assert [t.kv_head_start for t in layouts] == [0, 0, 1, 1]
    one = [TPLayout.of(config(kv=1), TPShard(r, 4)).kv_head_start for r in range(4)]
    assert one == [0, 0, 0, 0]


def test_mlp_and_row_splits():
    t = TPLayout.of(config(inter=128), TPShard(1, 2))
    assert t.intermediate_size == 64 and dict(t.mlp_split().starts) == {0: 64, 1: 64}
    row = t.row(128)
    assert (row.in_start, row.in_size, row.keeps_bias()) == (64, 64, False)


def test_one_rank_has_no_split():
    t = TPLayout.of(config(), TPShard())
    assert t.qkv_split() is None and t.row(128) is None and t.mlp_split() is None


@pytest.mark.parametrize("kw,size,what", [(dict(heads=6), 4, "num_attention_heads 6"),
                                          (dict(kv=3, heads=12), 2, "num_key_value_heads 3"),
                                          (dict(inter=100), 8, "intermediate_size 100")])
def test_sizes_that_do_not_divide_are_refused_naming_the_field(kw, size, what):
    with pytest.raises(InvalidParameterError, match=what) as e:
        check_divisible(config(**kw), size)
    assert e.value.param == "tensor_parallel_size"


def test_several_problems_read_as_one_sentence():
    with pytest.raises(InvalidParameterError) as e:
        check_divisible(config(kv=2, heads=12, inter=1024), 3)
    assert str(e.value) == ("tensor_parallel_size 3 does not divide the model's num_key_value_heads 2 (nor is it a "
                            "multiple of them) or its intermediate_size 1024")
