"""Structured outputs: constrained decoding to a JSON schema, a regex, a choice or a grammar.

params.py (StructuredOutputsParams, torch-free), backend.py (the backend / matcher protocol), xgrammar_backend.py
and llguidance_backend.py (the two backends), manager.py (per-tokenizer compiled-grammar cache, compile timeout),
bitmask.py (token bitmasks applied to logits)."""

from cinq.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
