"""A suite of JSON schemas for the structured-outputs benchmark and tests: nested objects, arrays with bounds,
enums, ``pattern``, ``anyOf`` and numbers with ranges. Every string and array is bounded (maxLength, maxItems), so
a valid output fits in a short token budget."""

from __future__ import annotations

from typing import Any

_NAMES = ["name", "city", "title", "label", "color", "animal", "brand", "team", "tool", "fruit"]
_ENUMS = [["red", "green", "blue"], ["low", "medium", "high"], ["cat", "dog", "bird", "fish"], ["yes", "no"],
          ["north", "south", "east", "west"], ["small", "large"]]
_PATTERNS = [r"^[a-z]{3,8}$", r"^[0-9]{3}-[0-9]{4}$", r"^[A-Z][a-z]{2,6}$", r"^v[0-9]\.[0-9]$",
             r"^[a-f0-9]{6}$", r"^(on|off)$"]


def _string(i: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": 6 + i % 7}


def _integer(i: int) -> dict[str, Any]:
    lo = (i * 7) % 50 - 10
    return {"type": "integer", "minimum": lo, "maximum": lo + 10 + i % 90}


def _number(i: int) -> dict[str, Any]:
    return {"type": "number", "minimum": 0, "maximum": 1 + i % 100}


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _field(kind: int, i: int) -> dict[str, Any]:
    if kind == 0:
        return _string(i)
    if kind == 1:
        return _integer(i)
    if kind == 2:
        return {"type": "boolean"}
    if kind == 3:
        return {"enum": _ENUMS[i % len(_ENUMS)]}
    if kind == 4:
        return {"type": "string", "pattern": _PATTERNS[i % len(_PATTERNS)]}
    if kind == 5:
        return {"type": "array", "items": _integer(i), "minItems": 1, "maxItems": 1 + i % 3}
    if kind == 6:
        return {"anyOf": [_integer(i), {"type": "string", "maxLength": 5}]}
    return _number(i)


def schema_suite(count: int = 60) -> list[dict[str, Any]]:
    """``count`` deterministic schemas, cycling through shapes: flat objects, nested objects, arrays of objects,
    top-level arrays, enums, patterns, anyOf, bounded numbers."""
    out: list[dict[str, Any]] = []
    for i in range(count):
        shape = i % 6
        a, b, c = _NAMES[i % 10], _NAMES[(i + 3) % 10], _NAMES[(i + 6) % 10]
        if shape == 0:  # flat object over three field kinds
            out.append(_obj({a: _field(i % 8, i), b: _field((i + 1) % 8, i), "id": _integer(i)}))
        elif shape == 1:  # nested object
            out.append(_obj({a: _field(i % 8, i), "details": _obj({b: _field((i + 3) % 8, i), c: _field(2, i)})}))
        elif shape == 2:  # bounded array of small objects
            item = _obj({a: _field(3, i), "score": _integer(i)})
            out.append(_obj({"items": {"type": "array", "items": item, "minItems": 1, "maxItems": 2 + i % 2}}))
        elif shape == 3:  # enum + pattern + number
            out.append(_obj({"kind": {"enum": _ENUMS[i % len(_ENUMS)]}, "code": _field(4, i), "value": _number(i)}))
        elif shape == 4:  # anyOf at the field and object level
            out.append(_obj({a: _field(6, i), "either": {"anyOf": [_obj({"x": _integer(i)}), _obj({"y": _string(i)})]}}))
        else:  # top-level bounded array
            out.append({"type": "array", "items": _field((i // 6) % 5, i), "minItems": 1, "maxItems": 3})
    return out
