"""$ per 1M tokens."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.plan.cost import dollars_per_million_tokens


def test_hand_computed():
    # $3.60/h = $0.001/s; 1000 tok/s -> 1e-6 $/token -> $1 per 1M tokens
    assert dollars_per_million_tokens(1000.0, 3.6) == pytest.approx(1.0)
    assert dollars_per_million_tokens(1000.0, 3.6, num_cards=4) == pytest.approx(4.0)
    assert dollars_per_million_tokens(0.0, 3.6) is None


def test_bad_input():
    with pytest.raises(InvalidParameterError):
        dollars_per_million_tokens(10.0, -1.0)
    with pytest.raises(InvalidParameterError):
        dollars_per_million_tokens(10.0, 1.0, num_cards=0)
