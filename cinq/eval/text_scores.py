"""Perplexity, and KL / top-1 agreement against a baseline, in one pass over a text.

The windows are perplexity's (cinq.eval.perplexity.scoring_windows: every token after the first predicted once),
so the perplexity is exactly ``perplexity(model, ids, context_len)``. The baseline's next-token log-probabilities
on the first ``kl_tokens`` predictions are computed once (``BaseScores``) and compared with every variant's
from the same forward that gives its perplexity: no second model in memory, no second forward per variant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from cinq.eval.perplexity import scoring_windows


@dataclass(slots=True)
class BaseScores:
    """The baseline's log-probs (float32 [predictions, vocab]) on the first predictions of a text."""

    logprobs: torch.Tensor
    context_len: int

    @property
    def tokens(self) -> int:
        return self.logprobs.shape[0]


@dataclass(slots=True)
class TextScores:
    """One model on one text: perplexity, and against a baseline mean KL(base || model) and top-1 agreement."""

    perplexity: float
    kl: float | None = None
    top1: float | None = None


def _predictions(model: Any, ids: torch.Tensor, context_len: int, batch_size: int, limit: int | None = None):
    """Yield (log-probs [n, V] float32, targets [n]) of consecutive predictions, in text order, window batch by
    window batch (stopping once ``limit`` predictions have been yielded)."""
    windows = scoring_windows(ids.numel(), context_len, context_len - 1)
    device = next(model.parameters()).device
    done = 0
    with torch.inference_mode():
        for b in range(0, len(windows), batch_size):
            batch = windows[b:b + batch_size]
            width = max(end - start for start, end, _ in batch)
            inp = torch.zeros(len(batch), width, dtype=torch.long)  # right padding: causal attention ignores it
            for row, (start, end, _) in enumerate(batch):
                inp[row, :end - start] = ids[start:end]
            logits = model.compute_logits(model(inp.to(device))[:, :-1]).float()
            for row, (start, end, first) in enumerate(batch):
                lo, hi = first - start - 1, end - start - 1  # target t sits at column t - start - 1
                yield logits[row, lo:hi].log_softmax(-1).cpu(), ids[first:end]
                done += hi - lo
                if limit is not None and done >= limit:
                    return


def base_scores(model: Any, token_ids: Sequence[int], context_len: int = 256, kl_tokens: int = 4096,
                batch_size: int = 8) -> BaseScores:
    """The baseline's log-probs on the first ``kl_tokens`` predictions of ``token_ids`` (in the windows of the
    whole text: a shorter text would end in a window of other contexts)."""
    ids = torch.as_tensor(list(token_ids), dtype=torch.long)
    parts = [lp for lp, _ in _predictions(model, ids, context_len, batch_size, limit=kl_tokens)]
    return BaseScores(torch.cat(parts)[:kl_tokens], context_len)


def score_text(model: Any, token_ids: Sequence[int], context_len: int = 256, base: BaseScores | None = None,
               batch_size: int = 8) -> TextScores:
    """Perplexity of ``token_ids`` under ``model`` and, with ``base``, KL / top-1 on its predictions."""
    if base is not None and base.context_len != context_len:
        raise ValueError(f"base scores were taken with context_len {base.context_len}, not {context_len}")
    ids = torch.as_tensor(list(token_ids), dtype=torch.long)
    nll, count, kl, agree, pos = 0.0, 0, 0.0, 0, 0
    for lp, tgt in _predictions(model, ids, context_len, batch_size):
        nll -= float(lp.gather(1, tgt.unsqueeze(1)).sum())
        count += tgt.numel()
        if base is not None and pos < base.tokens:
            n = min(lp.shape[0], base.tokens - pos)
            ref = base.logprobs[pos:pos + n]
            kl += float(F.kl_div(lp[:n], ref, log_target=True, reduction="sum"))
            agree += int((ref.argmax(-1) == lp[:n].argmax(-1)).sum())
            pos += n
    out = TextScores(math.exp(nll / max(count, 1)))
    if base is not None:
        out.kl, out.top1 = kl / max(pos, 1), agree / max(pos, 1)
    return out
