"""The grammar backend interface: compile a constraint once for a tokenizer, then one matcher per request.

A matcher follows one sequence: ``fill_bitmask`` writes the allowed next tokens (bit t of word t // 32) into one
row of an int32 bitmask; ``accept_token`` advances over a token (False: the grammar forbids it, state unchanged);
``rollback(n)`` undoes the last n accepted tokens (speculative verification scores drafts this way);
``is_terminated`` is True once an end-of-sequence token was accepted."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from cinq.structured.params import StructuredOutputsParams

T = TypeVar("T")


class GrammarMatcher(Protocol):
    def accept_token(self, token_id: int) -> bool: ...

    def fill_bitmask(self, bitmask: Any, row: int) -> None: ...

    def rollback(self, num_tokens: int) -> None: ...

    def is_terminated(self) -> bool: ...


class GrammarTokenizer(Protocol):
    """What the grammar compilers read of a tokenizer (cinq's ``model.tokenizer.Tokenizer`` is one): the
    ``tokenizers`` library's tokenizer behind it, whose vocabulary they index, and the end-of-sequence ids that
    end a grammar (the caller merges in the model's own; the first is llguidance's one eos)."""

    @property
    def backend_tokenizer(self) -> Any: ...

    @property
    def eos_token_ids(self) -> list[int]: ...


class GrammarBackend(Protocol):
    """One tokenizer's compiler. ``compile`` raises ``ValueError`` with the reason for a bad spec."""

    name: str

    def compile(self, spec: StructuredOutputsParams) -> Any: ...

    def matcher(self, compiled: Any) -> GrammarMatcher: ...


class WrappedMatcher:
    """A ``GrammarMatcher`` over a library's own matcher ``_m``, whose ``rollback(n)`` takes the same count."""

    __slots__ = ("_m",)

    def __init__(self, matcher: Any) -> None:
        self._m = matcher

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._m.rollback(num_tokens)


def choice_alternatives(choices: list[str]) -> str:
    """``"a" | "b"``: the choices as EBNF / Lark string literals (JSON escapes, which both grammars read)."""
    return " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def compile_spec(spec: StructuredOutputsParams, json_schema: Callable[[str], T], regex: Callable[[str], T],
                 grammar: Callable[[str], T], start_rule: str) -> T:
    """Compile ``spec`` with a backend's three compilers: a JSON schema (``json_object``: any object), a regex, or
    a grammar text in the backend's format (``choice``: one rule ``start_rule`` over the choices' literals)."""
    kind, text = spec.key()
    if kind == "json":
        return json_schema(text)
    if kind == "json_object":
        return json_schema(json.dumps({"type": "object"}))
    if kind == "regex":
        return regex(text)
    if kind == "choice":
        return grammar(f"{start_rule} {choice_alternatives(spec.choice or [])}")
    return grammar(text)
