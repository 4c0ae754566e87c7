"""Token bitmasks: int32 words, bit t % 32 of word t // 32 set when token t is allowed (xgrammar's and
llguidance's layout), applied to logit rows as -inf.

Applying is xgrammar's native kernel when it is installed (on this CPU ~0.1 ms per 49k-token row; the torch
unpacking below is ~100x slower) and the torch version otherwise."""

from __future__ import annotations

import torch

try:  # the native kernel (CPU and CUDA)
    from xgrammar import apply_token_bitmask_inplace as _native_apply
except ImportError:  # pragma: no cover - xgrammar is a base dependency
    _native_apply = None

_SHIFTS = torch.arange(32, dtype=torch.int32)


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """[rows, ceil(V / 32)] int32, all tokens allowed."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def bitmask_to_bool(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, W] int32 -> [R, V] bool (True: allowed)."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS.to(bitmask.device)) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
    """-inf at the tokens ``bitmask`` forbids in ``logits[rows[i]]`` (bitmask row i; every row in order when
    ``rows`` is None), in place; returned. Tokens past the bitmask's words (a padded LM head) are forbidden too.
    ``logits`` must be float32 and contiguous."""
    vocab = logits.shape[-1]
    covered = min(vocab, bitmask.shape[1] * 32)
    idx = list(range(logits.shape[0])) if rows is None else rows
    if vocab > covered:
        logits[idx, covered:] = float("-inf")
    if _native_apply is not None and logits.dtype == torch.float32 and logits.is_contiguous():
        if rows is None:
            _native_apply(logits, bitmask.to(logits.device), vocab_size=covered)
        else:  # bitmask row i goes to logits row rows[i]: the kernel takes a full-height mask with indices
            full = bitmask.new_full((logits.shape[0], bitmask.shape[1]), -1)
            full[rows] = bitmask
            _native_apply(logits, full.to(logits.device), vocab_size=covered, indices=list(rows))
        return logits
    allowed = bitmask_to_bool(bitmask.to(logits.device), covered)
    t = torch.tensor(idx, device=logits.device)
    sub = logits[t]
    sub[:, :covered].masked_fill_(~allowed, float("-inf"))
    logits[t] = sub
    return logits
