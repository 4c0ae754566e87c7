"""Benchmark inputs: random requests within their ranges, text windows that wrap."""

from __future__ import annotations

import pytest

from cinq.bench.workload import TokenWindows, around, random_requests, text_tokens
from cinq.errors import InvalidParameterError


def test_random_requests_stay_in_their_ranges_and_repeat_with_the_seed():
    reqs = random_requests(50, 100, (3, 9), (2, 4), seed=1, low_token=10)
    assert all(3 <= len(r.prompt) <= 9 and 2 <= r.output_len <= 4 for r in reqs)
    assert all(10 <= t < 100 for r in reqs for t in r.prompt)
    assert reqs == random_requests(50, 100, (3, 9), (2, 4), seed=1, low_token=10)
    assert reqs != random_requests(50, 100, (3, 9), (2, 4), seed=2, low_token=10)


def test_bad_ranges_name_the_field():
    with pytest.raises(InvalidParameterError) as e:
        random_requests(1, 100, (5, 4), (1, 1), seed=0)
    assert e.value.param == "input_len"


def test_around_is_half_to_one_and_a_half():
    assert around(128) == (64, 192) and around(1) == (1, 1)


def test_windows_are_consecutive_and_wrap():
    w = TokenWindows(list(range(10)))
    assert w.take(4) == [0, 1, 2, 3] and w.take(8) == [4, 5, 6, 7, 8, 9, 0, 1]


def test_text_tokens_use_the_models_tokenizer(tiny_llama):
    from cinq.model.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(tiny_llama)
    ids = text_tokens(tok, "held-out")
    assert len(ids) > 1000 and tok.decode(ids[:50]) in (tok.decode(ids))
