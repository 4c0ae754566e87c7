"""SamplingParams validation: each out-of-range value is an error naming the field and its range."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.sampling_params import SamplingParams


@pytest.mark.parametrize("field,value,fragment", [
    ("temperature", -0.1, "[0.0, 100.0]"),
    ("top_p", 0.0, "(0.0, 1.0]"),
    ("top_p", 1.5, "(0.0, 1.0]"),
    ("top_k", -2, "[-1,"),
    ("min_p", 1.1, "[0.0, 1.0]"),
    ("presence_penalty", 2.5, "[-2.0, 2.0]"),
    ("frequency_penalty", -3, "[-2.0, 2.0]"),
    ("repetition_penalty", 0.0, "(0.0, 100.0]"),
    ("n", 0, "[1, 128]"),
    ("max_tokens", -1, "[0,"),
    ("logprobs", 21, "[0, 20]"),
    ("prompt_logprobs", -1, "[0, 20]"),
    ("temperature", "hot", "number"),
    ("n", 1.5, "integer"),
    ("stop", [""], "non-empty"),
    ("stop_token_ids", [-1], "non-negative"),
    ("stop", 5, "a string or a list of strings"),
    ("stop_token_ids", 7, "a list of token ids"),
])
def test_out_of_range_names_field_and_range(field, value, fragment):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(**{field: value})
    assert e.value.param == field and field in str(e.value) and fragment in str(e.value)


def test_min_tokens_cannot_exceed_max_tokens():
    with pytest.raises(InvalidParameterError, match="min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)


def test_defaults_and_normalisation():
    p = SamplingParams(stop="x", temperature=0)
    assert p.stop == ["x"] and p.greedy and not p.has_penalties
    assert SamplingParams(repetition_penalty=1.2).has_penalties
    assert p.clone(seed=3).seed == 3 and p.clone().stop == ["x"]
