"""The search space: its product, its labels, and one-line errors for bad values."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.tune.space import Candidate, SearchSpace, parse_list


def test_the_space_is_the_product_of_its_dimensions():
    space = SearchSpace(("none", "rtn:8"), (0, 2), (4,), (256, 512), (None, 1024))
    cands = space.candidates()
    assert len(cands) == 2 * 2 * 1 * 2 * 2 and len(set(cands)) == len(cands)
    assert Candidate("rtn:8", 2, 4, 256, None) in cands
    assert "spec k=2" in Candidate("rtn:8", 2, 4, 256, None).label and "kv auto" in cands[0].label


def test_parse_list():
    assert parse_list("1,2, 3", "x") == (1, 2, 3)
    assert parse_list("auto,64", "kv_tokens", auto=True) == (None, 64)
    with pytest.raises(InvalidParameterError, match="--max-num-seqs must be comma-separated ints") as e:
        parse_list("4,x", "max_num_seqs")
    assert e.value.param == "max_num_seqs"


@pytest.mark.parametrize("space, param", [(SearchSpace(spec_ks=(-1,)), "spec_ks"),
                                          (SearchSpace(max_num_seqs=(0,)), "max_num_seqs"),
                                          (SearchSpace(kv_tokens=(0,)), "kv_tokens"),
                                          (SearchSpace(quants=()), "quants"),
                                          (SearchSpace(quants=("gptq:4,8",)), "quant")])
def test_bad_spaces_name_the_dimension(space, param):
    with pytest.raises(InvalidParameterError) as e:
        space.validate()
    assert e.value.param == param
