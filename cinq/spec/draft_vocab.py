"""The reduced draft vocabulary of an EAGLE-3 head: the N target tokens it can propose (EAGLE-3's ``t2d``).

The head's LM head is its largest matrix at a small target's size (SmolLM2-135M: 49,152 x 576, as many
multiply-adds as ~8 of the target's decoder layers), and most of its rows are tokens the target almost never
writes. EAGLE-3 keeps the N tokens most frequent in the target's own training outputs; a draft can then only
propose those, so ``coverage`` (the share of the target's tokens inside the set) bounds the acceptance any head
over that set can reach, and N trades that bound against the head's cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cinq.errors import InvalidParameterError


@dataclass(frozen=True, slots=True)
class DraftVocab:
    """Logits over part of the target's vocabulary: column j is target token ``ids[j]``, ascending, of ``size``.
    Ascending, the first of equal maxima is the same token whether one takes the argmax over these columns or over
    the full vocabulary with -inf elsewhere, so greedy drafts need no full-width row."""

    ids: torch.Tensor
    size: int

    def widen(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., size] float32 logits: these columns in their tokens' places, -inf elsewhere."""
        small = logits.float()
        out = small.new_full((*small.shape[:-1], self.size), float("-inf"))
        out[..., self.ids] = small
        return out

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The target token of each row's largest logit."""
        return self.ids[logits.argmax(-1)]


def frequent_tokens(tokens: np.ndarray, n: int, vocab_size: int) -> torch.Tensor:
    """The ``n`` most frequent ids of ``tokens`` (ties and ids never seen: lowest id first, which for a BPE
    vocabulary means earlier merges, i.e. commoner pieces), ascending, as int64."""
    if not 1 <= n <= vocab_size:
        raise InvalidParameterError(f"draft_vocab_size must be in [1, {vocab_size}] (the target's vocabulary), "
                                    f"got {n}", "draft_vocab_size")
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    # stable sort on -count keeps id order among equal counts
    order = np.argsort(-counts, kind="stable")[:n]
    return torch.from_numpy(np.sort(order)).to(torch.long)


def coverage(draft_ids: torch.Tensor, tokens: np.ndarray, vocab_size: int) -> float:
    """The share of ``tokens`` that are in the draft vocabulary ``draft_ids``."""
    inside = np.zeros(vocab_size, dtype=bool)
    inside[draft_ids.numpy()] = True
    tokens = np.asarray(tokens, dtype=np.int64)
    return float(inside[tokens].mean()) if tokens.size else 0.0
