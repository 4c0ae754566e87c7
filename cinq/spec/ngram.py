"""N-gram (prompt lookup) proposer: find the longest recent n-gram that the sequence ends with earlier in its own
tokens (prompt + output) and propose the tokens that followed it there. Costs no model call; pays off where
the output copies from the prompt (code edits, extraction, summaries quoting their source).

The search is vectorised over the history with numpy (one comparison of all windows per n), never a Python
loop over tokens.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """``propose(tokens)`` -> up to ``num_speculative_tokens`` draft tokens (empty when nothing matches)."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(f"ngram: need 1 <= prompt_lookup_min ({prompt_lookup_min}) <= prompt_lookup_max "
                             f"({prompt_lookup_max})")
        if num_speculative_tokens < 1:
            raise ValueError(f"ngram: num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, tokens: list[int] | np.ndarray) -> list[int]:
        """The continuation of the longest matching suffix (longest n first, from ``prompt_lookup_max`` down to
        ``prompt_lookup_min``) at its most recent earlier occurrence that is followed by ``k`` tokens; when none
        is, the one followed by the most. (The most recent occurrence alone fails on loops: in a repeating
        pattern it sits just before the end, with one token after it.)"""
        t = np.asarray(tokens, dtype=np.int64)
        length = t.shape[0]
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            # windows starting at 0 .. length - n - 1: each is followed by at least one token
            windows = sliding_window_view(t[:length - 1], n)
            hits = np.flatnonzero((windows == t[length - n:]).all(axis=1))
            if hits.size:
                full = hits[hits + n + self.k <= length]
                start = int(full[-1] if full.size else hits[0]) + n
                return t[start:start + self.k].tolist()
        return []

    def propose_batch(self, sequences: list[list[int]]) -> list[list[int]]:
        """``propose`` for each sequence of a step."""
        return [self.propose(seq) for seq in sequences]
