"""llguidance (Rust, Earley parser over a token trie): nothing precompiled, masks computed lazily per step."""

from __future__ import annotations

from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch

from cinq.structured.backend import WrappedMatcher, compile_spec
from cinq.structured.params import StructuredOutputsParams


class LLGuidanceMatcher(WrappedMatcher):
    __slots__ = ("_eos",)

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        super().__init__(llguidance.LLMatcher(tokenizer, grammar, log_level=0))
        self._eos = tokenizer.eos_token

    def accept_token(self, token_id: int) -> bool:
        if self._m.try_consume_tokens([token_id]) == 1:  # a forbidden token leaves the state unchanged
            return True
        # try_consume_tokens never takes the end-of-sequence token; consume_token does, where the grammar is complete
        return token_id == self._eos and self._m.is_accepting() and self._m.consume_token(token_id)

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        llguidance.torch.fill_next_token_bitmask(self._m, bitmask, row)

    def is_terminated(self) -> bool:
        return self._m.is_stopped()


class LLGuidanceBackend:
    """llguidance; a grammar text is Lark (llguidance's format). JSON without free whitespace."""

    name = "llguidance"

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        self._tok = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=stop_token_ids[0])

    def compile(self, spec: StructuredOutputsParams) -> str:
        options = {"whitespace_flexible": False}
        grammar = compile_spec(
            spec, lambda schema: llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options),
            llguidance.LLMatcher.grammar_from_regex, llguidance.LLMatcher.grammar_from_lark, start_rule="start:")
        bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self._tok)
        if bad:
            raise ValueError(messages[0] if messages else "invalid grammar")
        return grammar

    def matcher(self, compiled: str) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._tok, compiled)
