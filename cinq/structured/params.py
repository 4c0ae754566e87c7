"""StructuredOutputsParams: the constraint a request's output must satisfy (vLLM's names). Torch-free: it rides on
``SamplingParams`` through the engine-core messages (msgspec)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cinq.errors import InvalidParameterError

# Bounds on the spec itself (a grammar's compile time grows with its size; the timeout bounds the rest).
MAX_SPEC_CHARS = 64 * 1024
MAX_CHOICES = 256

_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(slots=True)
class StructuredOutputsParams:
    """Exactly one of: ``json`` (a JSON schema, dict or string), ``regex``, ``choice`` (the output is one of these
    strings), ``grammar`` (the backend's grammar text: xgrammar's EBNF, ``root ::= ...``), ``json_object``
    (any JSON object).

    The output then matches the constraint; the request ends when the grammar is complete and the model picks
    its end-of-sequence token (EOS is allowed only there), or at ``max_tokens`` (a truncated output need not
    match). Logprobs are those of the constrained distribution (forbidden tokens have -inf), as vLLM's."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def kind(self) -> str:
        """The one field that is set."""
        for name in _KINDS:
            value = getattr(self, name)
            if value is not None and value is not False:
                return name
        raise InvalidParameterError("structured_outputs: set one of json, regex, choice, grammar, json_object",
                                    "structured_outputs")

    def validate(self) -> None:
        """Shape checks only (one field set, types, sizes); whether the grammar compiles is the backend's word."""
        set_ = [n for n in _KINDS if getattr(self, n) is not None and getattr(self, n) is not False]
        if len(set_) != 1:
            raise InvalidParameterError(
                f"structured_outputs: set exactly one of {', '.join(_KINDS)} (got {set_ or 'none'})",
                "structured_outputs")
        kind = set_[0]
        field = f"structured_outputs.{kind}"
        value = getattr(self, kind)
        if kind == "json":
            if isinstance(value, str):
                try:
                    parsed = json.loads(value)
                except ValueError as e:
                    raise InvalidParameterError(f"{field}: not valid JSON ({e})", field) from None
            else:
                parsed = value
            if not isinstance(parsed, (dict, bool)):
                raise InvalidParameterError(f"{field}: a JSON schema must be an object, got {type(parsed).__name__}",
                                            field)
        elif kind in ("regex", "grammar"):
            if not isinstance(value, str) or not value:
                raise InvalidParameterError(f"{field} must be a non-empty string", field)
        elif kind == "choice":
            if not isinstance(value, list) or not value or len(value) > MAX_CHOICES:
                raise InvalidParameterError(f"{field} must be a list of 1 to {MAX_CHOICES} strings", field)
            if not all(isinstance(c, str) and c for c in value):
                raise InvalidParameterError(f"{field}: every choice must be a non-empty string", field)
        elif value is not True:
            raise InvalidParameterError(f"{field} must be true when given", field)
        if len(self.key()[1]) > MAX_SPEC_CHARS:
            raise InvalidParameterError(f"{field}: at most {MAX_SPEC_CHARS} characters", field)

    def key(self) -> tuple[str, str]:
        """(kind, canonical text): the compiled-grammar cache key."""
        kind = self.kind
        value = getattr(self, kind)
        if kind == "json":
            # property order is kept: it is the order the output writes them in
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            return kind, text
        if kind == "choice":
            return kind, json.dumps(value, ensure_ascii=False)
        if kind == "json_object":
            return kind, ""
        return kind, value
