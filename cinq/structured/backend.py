"""The grammar backend interface: compile a constraint once for a tokenizer, then one matcher per request.

A matcher follows one sequence: ``fill_bitmask`` writes the allowed next tokens (bit t of word t // 32) into one
row of an int32 bitmask; ``accept_token`` advances over a token (False: the grammar forbids it, state unchanged);
``rollback(n)`` undoes the last n accepted tokens (speculative verification scores drafts this way);
``is_terminated`` is True once an end-of-sequence token was accepted."""

from __future__ import annotations

from typing import Any, Protocol

from cinq.structured.params import StructuredOutputsParams


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


def choice_alternatives(choices: list[str]) -> str:
    """``"a" | "b"``: the choices as EBNF / Lark string literals (JSON escapes, which both grammars read)."""
    import json
    return " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
