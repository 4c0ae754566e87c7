"""QualitySettings' limits (the scoring itself runs in the stack and tune benchmarks' tests)."""

from __future__ import annotations

import pytest

from cinq.bench.served_quality import QualitySettings
from cinq.errors import InvalidParameterError


@pytest.mark.parametrize("field,value", [("ppl_tokens", 1), ("context_len", 0), ("n_problems", -1),
                                         ("ppl_tokens", 2.5)])
def test_a_size_out_of_its_limits_is_refused_by_name(field, value):
    with pytest.raises(InvalidParameterError, match=field) as e:
        QualitySettings(**{field: value}).validate()
    assert e.value.param == field


def test_the_smallest_sizes_are_accepted():
    QualitySettings(ppl_tokens=2, context_len=1, n_problems=0).validate()
