"""Perplexity of a token stream under a model, with the training-mode forward (no engine, no KV cache).

Long streams are scored in windows of ``context_len`` tokens moved by ``stride``: every token after the first
is predicted exactly once, so each prediction after the first window sees at least ``context_len - stride``
tokens of context. The default (and largest useful) stride is ``context_len - 1``: adjacent windows share the
one token that a window's first prediction needs (``stride=context_len`` is accepted and means the same).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from cinq.errors import InvalidParameterError


def scoring_windows(n: int, context_len: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first scored target) per window; targets first..end-1 are scored in that window.

    The first window scores targets 1..context_len-1; each later one scores the next ``stride`` targets with the
    ``context_len`` tokens that end at its last target as input."""
    end = min(context_len, n)
    out = [(0, end, 1)]
    scored = end - 1
    while scored < n - 1:
        last = min(scored + stride, n - 1)
        out.append((max(0, last + 1 - context_len), last + 1, scored + 1))
        scored = last
    return out


def token_nll(model: Any, token_ids: Sequence[int], context_len: int = 256, stride: int | None = None,
              batch_size: int = 8) -> tuple[float, int]:
    """Summed negative log-likelihood (nats) of tokens 1..N-1 and how many tokens it covers."""
    if not isinstance(context_len, int) or context_len < 2:
        raise InvalidParameterError(f"context_len must be an integer >= 2, got {context_len!r}", "context_len")
    stride = context_len - 1 if stride is None else stride
    if not isinstance(stride, int) or not (1 <= stride <= context_len):
        raise InvalidParameterError(f"stride must be an integer in [1, context_len={context_len}], got {stride!r}",
                                    "stride")
    # A window's first token has no prediction inside it, so a new window must start on an already scored token.
    stride = min(stride, context_len - 1)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidParameterError(f"batch_size must be a positive integer, got {batch_size!r}", "batch_size")
    ids = torch.as_tensor(list(token_ids), dtype=torch.long)
    if ids.numel() < 2:
        raise InvalidParameterError(f"token_ids must hold at least 2 tokens, got {ids.numel()}", "token_ids")
    device = next(model.parameters()).device
    windows = scoring_windows(ids.numel(), context_len, stride)
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for b in range(0, len(windows), batch_size):
                batch = windows[b:b + batch_size]
                width = max(end - start for start, end, _ in batch)
                # Right padding: causal attention keeps padded positions from touching the real ones.
                inp = torch.zeros(len(batch), width, dtype=torch.long)
                tgt = torch.full((len(batch), width - 1), -100, dtype=torch.long)
                for row, (start, end, first) in enumerate(batch):
                    inp[row, :end - start] = ids[start:end]
                    lo = first - start - 1  # target index t sits at column t - start - 1
                    tgt[row, lo:end - start - 1] = ids[first:end]
                logits = model.compute_logits(model(inp.to(device))[:, :-1])
                nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1).to(device),
                                      ignore_index=-100, reduction="sum")
                total += float(nll)
                count += int((tgt != -100).sum())
    finally:
        model.train(was_training)
    return total, count


def perplexity(model: Any, token_ids: Sequence[int], context_len: int = 256, stride: int | None = None,
               batch_size: int = 8) -> float:
    """exp(mean NLL) of tokens 1..N-1 of ``token_ids`` (windows of ``context_len`` moved by ``stride``, default
    ``context_len - 1``), ``batch_size`` windows per forward."""
    total, count = token_nll(model, token_ids, context_len, stride, batch_size)
    return math.exp(total / count)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with the tokenizer's special tokens (bos), from a cinq Tokenizer, a
    ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer."""
    out = tokenizer.encode(text, add_special_tokens=True)
    return list(out.ids) if hasattr(out, "ids") else list(out)


def perplexity_of_text(model: Any, tokenizer: Any, text: str, context_len: int = 256, stride: int | None = None,
                       batch_size: int = 8) -> float:
    """Perplexity of ``text`` tokenized with ``tokenizer`` (special tokens added, so the first word is scored)."""
    return perplexity(model, encode_text(tokenizer, text), context_len, stride, batch_size)
