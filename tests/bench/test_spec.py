"""SpecOptions' limits (the speculative-decoding benchmark itself runs in tests/commands/test_bench.py)."""

from __future__ import annotations

import pytest

from cinq.bench.spec import SpecOptions
from cinq.errors import InvalidParameterError


@pytest.mark.parametrize("change", [{"batch_sizes": ()}, {"batch_sizes": (1, 0)}, {"num_prompts": 0},
                                    {"prompt_len": 0}, {"max_tokens": -1}])
def test_a_setting_out_of_its_limits_is_refused_by_name(change):
    with pytest.raises(InvalidParameterError) as e:
        SpecOptions(**change).validate()
    assert e.value.param == next(iter(change))


def test_the_defaults_pass():
    SpecOptions().validate()
