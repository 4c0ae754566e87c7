"""Incremental detokenization that never emits a broken UTF-8 character, with stop strings found across token
boundaries.

Each step decodes a short window of tokens twice — the already-emitted part and the part plus the new tokens —
and emits the difference, holding back while the window still ends in an incomplete character (U+FFFD). The
window starts a few tokens before the first new one so tokenizers that merge leading spaces decode correctly.
"""

from __future__ import annotations

from cinq.model.tokenizer import Tokenizer
from cinq.sampling_params import SamplingParams

_CONTEXT_TOKENS = 5
_MAX_CHAR_TOKENS = 4  # a UTF-8 character has at most 4 bytes, so at most 4 byte-level tokens


class IncrementalDetokenizer:
    """The growing output text of one sequence."""

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.tokens = list(prompt_token_ids[-_CONTEXT_TOKENS - 1:])
        self.prefix_offset = max(len(self.tokens) - _CONTEXT_TOKENS, 0)
        self.read_offset = len(self.tokens)
        self.skip_special_tokens = params.skip_special_tokens
        self.stop = list(params.stop)
        self.include_stop = params.include_stop_str_in_output
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        # as vLLM: stop strings count only in the text of output tokens past min_tokens
        self.min_tokens = params.min_tokens
        self.num_output = 0
        self.output_text = ""

    def update(self, new_token_ids: list[int]) -> str | None:
        """Append tokens; returns the stop string if one now appears (the text is cut at it)."""
        for tok in new_token_ids:
            self.tokens.append(tok)
            self.num_output += 1
            prefix = self.tokenizer.decode(self.tokens[self.prefix_offset:self.read_offset], self.skip_special_tokens)
            full = self.tokenizer.decode(self.tokens[self.prefix_offset:], self.skip_special_tokens)
            if full.endswith("\ufffd") and len(self.tokens) - self.read_offset < _MAX_CHAR_TOKENS:
                continue  # mid-character: wait for the rest of its bytes
            # A token with no text (a skipped special, an id the tokenizer lacks) still moves the window on,
            # so the decoded window never grows without bound.
            delta = full[len(prefix):] if len(full) > len(prefix) else ""
            self.output_text += delta
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
            if self.stop and self.num_output > self.min_tokens:
                hit = self._find_stop(len(delta))
                if hit is not None:
                    return hit
        return None

    def _find_stop(self, new_chars: int) -> str | None:
        text = self.output_text
        search_from = max(0, len(text) - new_chars - self.max_stop_len + 1)
        best: tuple[int, str] | None = None
        for s in self.stop:
            idx = text.find(s, search_from)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return None
        idx, s = best
        self.output_text = text[:idx + len(s)] if self.include_stop else text[:idx]
        return s

    def visible_text(self, finished: bool) -> str:
        """Text safe to show now: while running, the last characters that could start a stop string are held."""
        if finished or not self.stop or self.include_stop:
            return self.output_text
        hold = self.max_stop_len - 1
        return self.output_text[:-hold] if hold > 0 else self.output_text
