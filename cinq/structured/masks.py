"""The runner's side of constrained decoding: one bitmask row per constrained logit row of a step, and advancing
the matchers over the tokens a step emitted.

A plain decode row's mask is its matcher's state. A verify step's row j scores the token after the path to node j
(the first j drafts of a chain, or the ancestors of tree node j): the matcher advances over that path, fills the
row, and rolls back, so the target's masked distribution judges every draft and the state moves only over the
tokens finally emitted. A row whose path holds a token the grammar forbids is unreachable (that draft has
probability 0 at its parent row and is rejected there): it is left unmasked."""

from __future__ import annotations

import logging

import torch

from cinq.structured.backend import GrammarMatcher
from cinq.structured.bitmask import allocate_bitmask, apply_token_bitmask

log = logging.getLogger(__name__)


def mask_logits(logits: torch.Tensor, matchers: list[GrammarMatcher | None],
                paths: list[list[int]] | None = None) -> torch.Tensor:
    """``logits`` [R, V] with each constrained row's forbidden tokens at -inf (float32; the input itself when no
    row is constrained). ``matchers[r]``: row r's request matcher (None: unconstrained); ``paths[r]``: the tokens
    row r comes after, beyond the matcher's state (verify steps)."""
    rows = [r for r, m in enumerate(matchers) if m is not None and not m.is_terminated()]
    if not rows:
        return logits
    bitmask = allocate_bitmask(len(rows), logits.shape[-1])
    # A request's rows are consecutive; its matcher walks from one row's path to the next through their common
    # prefix (a chain of k drafts costs k accepts, not k^2), then rolls back to where it started.
    current: list[int] = []
    for i, r in enumerate(rows):
        m = matchers[r]
        path = paths[r] if paths is not None else []
        common = 0
        while common < min(len(current), len(path)) and current[common] == path[common]:
            common += 1
        m.rollback(len(current) - common)
        current = current[:common]
        for tok in path[common:]:
            if not m.accept_token(tok):
                break
            current.append(tok)
        if len(current) == len(path) and not m.is_terminated():
            m.fill_bitmask(bitmask, i)
        if i + 1 == len(rows) or matchers[rows[i + 1]] is not m:
            m.rollback(len(current))
            current = []
    logits = logits.float().contiguous()
    return apply_token_bitmask(logits, bitmask, rows)


def advance(matcher: GrammarMatcher | None, tokens: list[int], request_id: str) -> None:
    """Move a request's matcher over the tokens its step emitted (masked, so the grammar allows them)."""
    if matcher is None:
        return
    for tok in tokens:
        if matcher.is_terminated():
            return
        if not matcher.accept_token(tok):
            log.warning("structured outputs: %s emitted token %d its grammar forbids", request_id, tok)
            return
