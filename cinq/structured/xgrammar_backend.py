"""xgrammar (vLLM's default backend): grammars compiled ahead into per-state token masks, fast mask fills."""

from __future__ import annotations

import json
from typing import Any

import xgrammar as xgr

from cinq.structured.backend import choice_alternatives
from cinq.structured.params import StructuredOutputsParams


class XGrammarMatcher:
    __slots__ = ("_m",)

    def __init__(self, compiled: Any) -> None:
        self._m = xgr.GrammarMatcher(compiled)

    def accept_token(self, token_id: int) -> bool:
        return self._m.accept_token(token_id)

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._m.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self._m.is_terminated()


class XGrammarBackend:
    """xgrammar over a Hugging Face fast tokenizer; JSON without free whitespace (small models otherwise pad)."""

    name = "xgrammar"

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, spec: StructuredOutputsParams) -> Any:
        kind, text = spec.key()
        try:
            if kind == "json":
                return self._compiler.compile_json_schema(text, any_whitespace=False)
            if kind == "json_object":
                return self._compiler.compile_json_schema(json.dumps({"type": "object"}), any_whitespace=False)
            if kind == "regex":
                return self._compiler.compile_regex(text)
            if kind == "choice":
                return self._compiler.compile_grammar(f"root ::= {choice_alternatives(spec.choice or [])}")
            return self._compiler.compile_grammar(text)
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's parse errors
            raise ValueError(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None

    def matcher(self, compiled: Any) -> XGrammarMatcher:
        return XGrammarMatcher(compiled)
