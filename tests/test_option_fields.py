"""Options validated through field metadata: a bounded field's limit is checked and named, None is an optional
setting only where the default is None, and fields without limits are left alone."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, bounded_each, check_bounds, from_known_fields


@dataclass(slots=True)
class Options:
    rounds: int = bounded(3, ge=1)
    rate: float = bounded(1.0, gt=0, le=100)
    cap: int | None = bounded(None, ge=0)
    name: str = "x"


def test_values_within_their_limits_pass() -> None:
    check_bounds(Options())
    check_bounds(Options(rounds=1, rate=100, cap=0))


@pytest.mark.parametrize("kwargs,field,limit", [
    ({"rounds": 0}, "rounds", "an integer >= 1"), ({"rate": 0.0}, "rate", "a number > 0 and <= 100"),
    ({"rate": 101}, "rate", "<= 100"), ({"rounds": 2.5}, "rounds", "an integer"),
    ({"rounds": True}, "rounds", ">= 1"), ({"rounds": None}, "rounds", ">= 1"), ({"cap": -1}, "cap", ">= 0"),
])
def test_a_value_out_of_its_limits_names_the_field_and_the_limit(kwargs: dict, field: str, limit: str) -> None:
    with pytest.raises(InvalidParameterError, match=limit) as err:
        check_bounds(Options(**kwargs))
    assert err.value.param == field and str(err.value).startswith(field)


@dataclass(slots=True)
class Required:
    steps: int = bounded(ge=1, integer=True)


def test_a_required_field_keeps_its_limits() -> None:
    check_bounds(Required(steps=3))
    with pytest.raises(InvalidParameterError, match="steps must be an integer >= 1, got 3.0"):
        check_bounds(Required(steps=3.0))
    with pytest.raises(TypeError):
        Required()  # type: ignore[call-arg]


@dataclass(slots=True)
class Sweep:
    lens: tuple[int, ...] = bounded_each((8, 64), ge=1)
    rates: tuple[float, ...] = bounded_each((2.0, float("inf")), gt=0)


def test_each_value_of_a_tuple_field_keeps_the_limits() -> None:
    check_bounds(Sweep())
    check_bounds(Sweep(lens=(1,), rates=(0.5,)))
    for kwargs, field, said in [({"lens": ()}, "lens", "one or more values"), ({"lens": (8, 0)}, "lens", ">= 1"),
                                ({"lens": (8, 2.5)}, "lens", "each an integer"), ({"rates": (1.0, -1.0)}, "rates", "> 0"),
                                ({"lens": 8}, "lens", "one or more values")]:
        with pytest.raises(InvalidParameterError, match=said) as err:
            check_bounds(Sweep(**kwargs))
        assert err.value.param == field


def test_from_known_fields_builds_and_names_an_unknown_key():
    assert from_known_fields(Options, {"rounds": 5}, "opts") == Options(rounds=5)
    with pytest.raises(InvalidParameterError, match=r"opts: unknown field\(s\) \['speed'\]; known: .*'old'") as e:
        from_known_fields(Options, {"speed": 1, "rounds": 2}, "opts", frozenset({"old"}))
    assert e.value.param == "speed"
