"""Token bitmasks: int32 words, bit t % 32 of word t // 32 set when token t is allowed (xgrammar's and
llguidance's layout), applied to logit rows as -inf.

Applying goes through a 256-entry table: each byte of the mask selects the 8 additive values (0 or -inf) of its 8
tokens (one index_select), which are added to the rows (x + 0 is x exactly, x + -inf is -inf). On this CPU that is
~3x faster than xgrammar's native kernel and ~5x faster than a boolean masked_fill (which torch runs slowly)."""

from __future__ import annotations

import torch

_SHIFTS = torch.arange(32, dtype=torch.int32, device="cpu")
_BYTE_BITS = (torch.arange(256)[:, None] >> torch.arange(8)) & 1  # [256, 8]: bit j of each byte value
_ADDITIVE = torch.where(_BYTE_BITS.bool(), 0.0, float("-inf")).float().contiguous()  # [256, 8]
_tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """[rows, ceil(V / 32)] int32, all tokens allowed."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def bitmask_to_bool(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, W] int32 -> [R, V] bool (True: allowed); the reference the additive form is tested against."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS.to(bitmask.device)) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


def additive_mask(bitmask: torch.Tensor, vocab_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[R, W] int32 -> [R, V] of 0 (allowed) / -inf (forbidden); tokens past the mask's words are forbidden."""
    key = (bitmask.device, dtype)
    table = _tables.get(key)
    if table is None:
        table = _tables[key] = _ADDITIVE.to(bitmask.device, dtype)
    rows = bitmask.shape[0]
    out = table.index_select(0, bitmask.contiguous().view(torch.uint8).view(-1).to(torch.int64)).view(rows, -1)
    if out.shape[1] >= vocab_size:
        return out[:, :vocab_size]
    return torch.cat([out, out.new_full((rows, vocab_size - out.shape[1]), float("-inf"))], 1)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
    """-inf at the tokens ``bitmask`` forbids in ``logits[rows[i]]`` (bitmask row i; every row in order when
    ``rows`` is None), in place; returned. Tokens past the bitmask's words (a padded LM head) are forbidden too."""
    add = additive_mask(bitmask.to(logits.device), logits.shape[-1], logits.dtype)
    if rows is None:
        return logits.add_(add)
    if rows == list(range(rows[0], rows[0] + len(rows))):
        logits[rows[0]:rows[0] + len(rows)].add_(add)
        return logits
    return logits.index_add_(0, torch.tensor(rows, device=logits.device), add)
