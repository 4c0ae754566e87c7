"""The request fields that constrain a completion, as one ``StructuredOutputsParams``: OpenAI's
``response_format`` (``json_object``, ``json_schema``), vLLM's ``structured_outputs`` extra body and the older
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` names. An error names the field the
client sent (``response_format``, ``guided_regex`` ...), whether the shape is wrong or the grammar does not
compile."""

from __future__ import annotations

from typing import Any

from cinq.errors import InvalidParameterError
from cinq.structured.manager import DEFAULT_BACKEND
from cinq.structured.params import StructuredOutputsParams

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def _build(field: str, **kwargs: Any) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**kwargs)
    except InvalidParameterError as e:
        raise rename(e, field) from None


def rename(error: InvalidParameterError, field: str) -> InvalidParameterError:
    """The same error, naming the request's ``field`` instead of ``structured_outputs.<kind>``."""
    param = error.param or ""
    if not param.startswith("structured_outputs") or field == "structured_outputs":
        return error
    message = str(error)
    message = message.replace(param, field, 1) if message.startswith(param) else f"{field}: {message}"
    return InvalidParameterError(message, field)


def constraint_from_fields(values: dict[str, Any]) -> tuple[StructuredOutputsParams | None, str | None]:
    """(constraint, the field it came from) from the request's ``structured_outputs`` dict and ``guided_*``
    values (None when unset); more than one given is an error."""
    given = [name for name in ("structured_outputs", *GUIDED) if values.get(name) is not None]
    if not given:
        return None, None
    if len(given) > 1:
        raise InvalidParameterError(f"give only one of {', '.join(given)}", given[1])
    field = given[0]
    value = values[field]
    if field == "structured_outputs":
        if not isinstance(value, dict):
            raise InvalidParameterError("structured_outputs must be an object", field)
        unknown = sorted(set(value) - set(_STRUCTURED_KEYS) - {"disable_any_whitespace", "backend",
                                                               "whitespace_pattern"})
        if unknown:
            raise InvalidParameterError(f"structured_outputs: unknown key {unknown[0]!r} (one of "
                                        f"{', '.join(_STRUCTURED_KEYS)})", f"structured_outputs.{unknown[0]}")
        _check_options(value)
        return _build(field, **{k: v for k, v in value.items() if k in _STRUCTURED_KEYS}), field
    return _build(field, **{GUIDED[field]: value}), field


def _check_options(value: dict[str, Any]) -> None:
    """vLLM's per-request options: one backend compiles everything here, and JSON never has free whitespace
    (``disable_any_whitespace`` is what cinq always does), so a whitespace pattern cannot apply."""
    backend = value.get("backend")
    if backend not in (None, "auto", DEFAULT_BACKEND):
        raise InvalidParameterError(f"structured_outputs.backend {backend!r}: this server compiles every constraint "
                                    f"with {DEFAULT_BACKEND!r} (no per-request backend)", "structured_outputs.backend")
    if value.get("whitespace_pattern") is not None:
        raise InvalidParameterError("structured_outputs.whitespace_pattern is not supported by cinq (JSON is "
                                    "generated without free whitespace)", "structured_outputs.whitespace_pattern")


def constraint_from_response_format(fmt: Any) -> StructuredOutputsParams | None:
    """``response_format``: ``text`` (none), ``json_object`` or ``json_schema`` (its ``schema``)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        schema = getattr(spec, "schema_", None) if spec is not None else None
        if schema is None:
            raise InvalidParameterError("response_format: json_schema needs a 'schema' object",
                                        "response_format.json_schema.schema")
        return _build("response_format.json_schema.schema", json=schema)
    raise InvalidParameterError(f"response_format type {fmt.type!r} is not one of 'text', 'json_object', "
                                "'json_schema'", "response_format.type")


async def add_all_naming(ctx: Any, field: str | None, *args: Any) -> Any:
    """``ctx.add_all(*args)``; a constraint that does not compile is reported under the request's ``field``."""
    try:
        return await ctx.add_all(*args)
    except InvalidParameterError as e:
        if field is None:
            raise
        raise rename(e, field) from None
