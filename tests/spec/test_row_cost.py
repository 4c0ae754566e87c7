"""RowCurve: a profiled step cost by rows, linear between points, proportional past the last."""

from __future__ import annotations

import pytest

from cinq.spec.row_cost import RowCurve


def test_linear_between_points_flat_below_and_proportional_past_the_last() -> None:
    curve = RowCurve.of({1: 1.0, 8: 1.0, 16: 2.0, 32: 4.0})
    assert curve(1) == curve(0.5) == curve(4) == 1.0
    assert curve(12) == pytest.approx(1.5)
    assert curve(64) == pytest.approx(8.0)


def test_a_reading_above_a_later_one_is_noise() -> None:
    """The first row count's steps carry warm-up: a 1-row step read dearer than 2 rows is clipped to it."""
    curve = RowCurve.of({1: 1.5, 2: 1.0, 4: 1.1})
    assert curve.seconds == (1.0, 1.0, 1.1)


@pytest.mark.parametrize("bad", [{}, {0: 1.0}, {4: 0.0}, {4: -1.0}])
def test_bad_points_are_refused(bad: dict[int, float]) -> None:
    with pytest.raises(ValueError, match="row curve"):
        RowCurve.of(bad)
