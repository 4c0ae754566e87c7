"""Options classes validate through their fields' metadata, not hand-written checks: a field declared with
``bounded(default, ge=..., le=...)`` carries its limits, and ``check_bounds(options)`` checks every such field,
raising one InvalidParameterError that names the field and the limit (as ``cinq.config`` does for the engine's
arguments); ``bounded_each((...), ge=...)`` does the same for a non-empty tuple, value by value. Checks that relate
fields to each other stay in the class's ``validate()``."""

from __future__ import annotations

import operator
from dataclasses import MISSING, field, fields
from typing import Any, TypeVar

from cinq.errors import InvalidParameterError

T = TypeVar("T")

_LIMITS = {"ge": (">=", operator.ge), "gt": (">", operator.gt), "le": ("<=", operator.le), "lt": ("<", operator.lt)}


def bounded(default: Any = MISSING, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, integer: bool | None = None) -> Any:
    """A dataclass field whose value must be a number within the given limits: an integer when the default is
    one (or ``integer``: a field with no default says it), and ``None`` only where the default is ``None`` (an
    optional setting)."""
    if integer is None:
        integer = isinstance(default, int) and not isinstance(default, bool)
    return field(default=default, metadata={"limits": {"ge": ge, "gt": gt, "le": le, "lt": lt}, "integer": integer})


def bounded_each(default: tuple[Any, ...], *, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, lt: float | None = None, integer: bool | None = None) -> Any:
    """A dataclass field holding a non-empty tuple of numbers, each within the given limits (integers when the
    default's are)."""
    if integer is None:
        integer = all(isinstance(v, int) and not isinstance(v, bool) for v in default)
    return field(default=default, metadata={"limits": {"ge": ge, "gt": gt, "le": le, "lt": lt}, "integer": integer,
                                            "each": True})


def _within(value: Any, limits: dict[str, float | None], integer: bool) -> bool:
    return isinstance(value, int if integer else (int, float)) and not isinstance(value, bool) and all(
        _LIMITS[name][1](value, bound) for name, bound in limits.items() if bound is not None)


def check_bounds(options: object) -> None:
    """Check every ``bounded`` / ``bounded_each`` field of a dataclass instance against its limits."""
    for f in fields(options):  # type: ignore[arg-type]
        limits = f.metadata.get("limits")
        if limits is None:
            continue
        value = getattr(options, f.name)
        if value is None and f.default is None:
            continue
        integer, each = f.metadata["integer"], f.metadata.get("each", False)
        if each:
            ok = isinstance(value, (tuple, list)) and len(value) > 0 and all(_within(v, limits, integer) for v in value)
        else:
            ok = _within(value, limits, integer)
        if not ok:
            said = " and ".join(f"{_LIMITS[name][0]} {bound}" for name, bound in limits.items() if bound is not None)
            kind = "an integer" if integer else "a number"
            what = f"one or more values, each {kind} {said}" if each else f"{kind} {said}"
            got = list(value) if isinstance(value, tuple) else value
            raise InvalidParameterError(f"{f.name} must be {what}, got {got!r}", f.name)


def from_known_fields(cls: type[T], d: dict[str, Any], where: str, also_known: frozenset[str] = frozenset()) -> T:
    """``cls(**d)`` for a config given as a JSON object: a key that is not one of ``cls``'s fields is an
    InvalidParameterError naming it and listing the known ones (with ``also_known``, names read before this)."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(d) - known)
    if unknown:
        raise InvalidParameterError(f"{where}: unknown field(s) {unknown}; known: {sorted(known | also_known)}",
                                    unknown[0])
    return cls(**d)
