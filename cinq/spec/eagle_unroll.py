"""An EAGLE head unrolled over its own outputs on whole sequences at once: EAGLE-3's "training-time test", and
the offline measure of how many chained drafts the target would accept.

Serving drafts in a chain: after the target has produced token x_{t+1} from its feature f_t, the head runs at
position t on (x_{t+1}, f_t) (step 0), then at t + 1 on (its draft, its own output feature) (step 1), and so
on, each step attending to the head's KV of the verified positions 0..t and to the chain's own earlier steps.
Here every position t of a [B, S] batch starts such a chain, all in parallel: step j's row i is the chain
started at ``t = i - j``, at position i, fed the sequence's own token after i (for greedy acceptance, a draft
only counts while it equals that token, so feeding the real token is exact; EAGLE-3 trains the same way) and
the previous step's output of row i - 1. Its attention mask lets row i see step 0's keys at positions <= i - j
and the keys of its own chain at the earlier steps (the diagonals), as HASS / EAGLE-3 do.

The head's own ``LlamaDecoderLayer`` runs each step unchanged: for the unroll its attention is bound to
``UnrollBackend``, an attention backend that keeps every step's K/V in memory (with autograd) instead of a
paged cache and applies that mask. Rows i < j start before the sequence and are garbage; no valid row reads
them, and callers mask them out (``valid_rows``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cinq.spec.eagle import EagleHead


def unroll_mask(seq_len: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[S, (step + 1) * S] bool: which keys (step 0's, then each later step's) step ``step``'s queries see."""
    i = torch.arange(seq_len, device=device)
    blocks = [i[None, :] <= i[:, None] - step]  # step 0: the verified prefix of the chain, positions <= t
    for s in range(1, step + 1):
        # step s's entry of the same chain sits at row t + s = i - (step - s)
        blocks.append(i[None, :] == i[:, None] - (step - s))
    mask = torch.cat(blocks, dim=1)
    mask[:, step * seq_len:].fill_diagonal_(True)  # every row sees itself, so rows i < step stay finite
    return mask


class UnrollBackend:
    """Attention over the unrolled steps' K/V held in memory ([B, S, H, D] each), masked by ``unroll_mask``."""

    name = "unroll"

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: object) -> None:
        self.keys.append(key)
        self.values.append(value)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: object, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        step = len(self.keys) - 1
        k = torch.cat(self.keys, dim=1).transpose(1, 2)
        v = torch.cat(self.values, dim=1).transpose(1, 2)
        mask = unroll_mask(query.shape[1], step, query.device)
        o = F.scaled_dot_product_attention(query.transpose(1, 2), k, v, attn_mask=mask, scale=scale,
                                           enable_gqa=True)
        return o.transpose(1, 2)


@dataclass(slots=True)
class _UnrollMeta:
    """What the Attention layer reads from its metadata on the way to the backend."""

    slot_mapping: None = None


@contextlib.contextmanager
def _bound(head: EagleHead) -> Iterator[UnrollBackend]:
    backend = UnrollBackend()
    attn = head.attention_layers()[0]
    saved = attn.backend, attn.kv_cache
    attn.backend, attn.kv_cache = backend, torch.empty(0)  # type: ignore[assignment]
    try:
        yield backend
    finally:
        attn.backend, attn.kv_cache = saved


def unroll(head: EagleHead, next_tokens: torch.Tensor, features: torch.Tensor, steps: int
           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(next_feature, normed) [B, S, H] of each of ``steps`` chained steps. ``next_tokens[:, i]`` is the token
    after position i, ``features[:, i]`` the fused target feature at i; positions are 0..S-1."""
    if len(head.attention_layers()) != 1:
        raise ValueError("unroll: the head must have exactly one attention layer")
    b, s = next_tokens.shape
    positions = torch.arange(s, device=next_tokens.device).expand(b, s)
    outs: list[tuple[torch.Tensor, torch.Tensor]] = []
    feature = features
    with _bound(head):
        for step in range(steps):
            if step:
                prev = outs[-1][0]
                # row i continues the chain whose previous step sat at row i - 1
                feature = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], dim=1)
            outs.append(head(next_tokens, feature, positions, _UnrollMeta()))  # type: ignore[arg-type]
    return outs


def valid_rows(seq_len: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[S] bool: the rows of step ``step`` that belong to a chain starting inside the sequence (i >= step)."""
    return torch.arange(seq_len, device=device) >= step
