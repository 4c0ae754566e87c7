"""Options classes validate through their fields' metadata, not hand-written checks: a field declared with
``bounded(default, ge=..., le=...)`` carries its limits, and ``check_bounds(options)`` checks every such field,
raising one InvalidParameterError that names the field and the limit (as ``cinq.config`` does for the engine's
arguments). Checks that relate fields to each other stay in the class's ``validate()``."""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

from cinq.errors import InvalidParameterError


def bounded(default: Any, *, ge: float | None = None, le: float | None = None, gt: float | None = None) -> Any:
    """A dataclass field whose value must be a number within the given limits (``None`` allowed only as a
    ``None`` default: an optional setting)."""
    return field(default=default, metadata={"ge": ge, "le": le, "gt": gt})


def check_bounds(options: object) -> None:
    """Check every ``bounded`` field of a dataclass instance against its limits."""
    for f in fields(options):  # type: ignore[arg-type]
        if not {"ge", "le", "gt"} & set(f.metadata):
            continue
        value = getattr(options, f.name)
        if value is None and f.default is None:
            continue
        ge, le, gt = f.metadata["ge"], f.metadata["le"], f.metadata["gt"]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
            (ge is None or value >= ge) and (le is None or value <= le) and (gt is None or value > gt)
        if not ok:
            limits = [s for s in (f">= {ge}" if ge is not None else "", f"> {gt}" if gt is not None else "",
                                  f"<= {le}" if le is not None else "") if s]
            raise InvalidParameterError(f"{f.name} must be a number {' and '.join(limits)}, got {value!r}", f.name)
