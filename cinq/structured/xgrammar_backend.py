"""xgrammar (vLLM's default backend): grammars compiled ahead into per-state token masks, fast mask fills."""

from __future__ import annotations

import json
import re
from typing import Any

import xgrammar as xgr

from cinq.structured.backend import WrappedMatcher, compile_spec
from cinq.structured.params import StructuredOutputsParams


def strict_strings(node: Any) -> Any:
    """The schema with each length-bounded plain string (minLength / maxLength, no pattern, format, enum or const)
    given as the equivalent pattern without control characters, quotes or backslashes. xgrammar 0.2's rule for
    such strings lets control characters through, which JSON forbids unescaped; its pattern rule does not."""
    if isinstance(node, list):
        return [strict_strings(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_strings(v) for k, v in node.items()}
    bounded = "minLength" in out or "maxLength" in out
    if out.get("type") == "string" and bounded and not ({"pattern", "format", "enum", "const"} & out.keys()):
        lo, hi = out.pop("minLength", 0), out.pop("maxLength", None)
        if isinstance(lo, int) and (hi is None or isinstance(hi, int)):
            out["pattern"] = "^[^\\x00-\\x1f\"\\\\]{%d,%s}$" % (lo, "" if hi is None else hi)
        else:  # not integers: left for the compiler to refuse
            out["minLength"], out["maxLength"] = lo, hi
    return out


_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # "[03:13:22] /project/cpp/x.cc:94: "


def _reason(error: BaseException) -> str:
    """xgrammar's message, first line, without its C++ log prefix."""
    lines = str(error).strip().splitlines()
    return _LOG_PREFIX.sub("", lines[0]) if lines else type(error).__name__


class XGrammarMatcher(WrappedMatcher):
    __slots__ = ()

    def __init__(self, compiled: Any) -> None:
        super().__init__(xgr.GrammarMatcher(compiled))

    def accept_token(self, token_id: int) -> bool:
        return self._m.accept_token(token_id)

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self._m.is_terminated()


class XGrammarBackend:
    """xgrammar over a Hugging Face fast tokenizer; JSON without free whitespace (small models otherwise pad)."""

    name = "xgrammar"

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, spec: StructuredOutputsParams) -> Any:
        c = self._compiler
        try:
            return compile_spec(
                spec, lambda schema: c.compile_json_schema(json.dumps(strict_strings(json.loads(schema))),
                                                           any_whitespace=False),
                c.compile_regex, c.compile_grammar, start_rule="root ::=")
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's parse errors
            raise ValueError(_reason(e)) from None

    def matcher(self, compiled: Any) -> XGrammarMatcher:
        return XGrammarMatcher(compiled)
