"""Rejection sampling of draft tokens (Leviathan et al. 2023; Chen et al. 2023): the emitted tokens follow the
target's distribution exactly, whatever the proposer proposed.

Request i proposed ``k_i`` draft tokens x_1..x_k (``k_i`` may be 0) and the target scored all of them in one
forward, giving its distributions p_1..p_{k+1} (after the request's temperature / top-k / top-p / min-p). Draft
x_j is accepted with probability min(1, p_j(x_j) / q_j(x_j)), where q_j is the proposer's distribution (one-hot
for proposers without one: n-gram lookup, greedy heads). At the first rejection the step emits one token from
norm(max(0, p_j - q_j)) and stops; when all k are accepted it emits a bonus token from p_{k+1}. Greedy requests
accept while the draft equals argmax p_j and then emit argmax.

Randomness: uniforms are float64 (a float32 uniform cannot resolve small acceptance ratios); a request with its
own generator draws everything from it in a fixed order (its k uniforms, then its final token's noise), so its
tokens do not depend on its batch mates. Draft ids outside the vocabulary have p = 0: they are rejected and
never emitted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cinq.layers.sampler import row_argmax


@dataclass(slots=True)
class DraftBatch:
    """The drafts of one verify step, flattened over requests (request i owns ``num_draft_tokens[i]`` rows)."""

    num_draft_tokens: list[int]
    token_ids: torch.Tensor  # [sum k] int64
    probs: torch.Tensor | None = None  # [sum k, V]: the proposer's distribution at each draft; None: one-hot


@dataclass(slots=True)
class RejectionResult:
    """Per request: the tokens the step emits (accepted drafts, then one recovered or bonus token)."""

    token_ids: list[list[int]]
    num_accepted: list[int]


def target_rows(num_draft_tokens: list[int]) -> tuple[list[int], list[int]]:
    """(first target row, bonus row) of each request in a ``[sum(k_i + 1), V]`` target tensor."""
    starts, bonus, at = [], [], 0
    for k in num_draft_tokens:
        starts.append(at)
        bonus.append(at + k)
        at += k + 1
    return starts, bonus


def rejection_sample(target_probs: torch.Tensor, drafts: DraftBatch, greedy: torch.Tensor,
                     generators: dict[int, torch.Generator] | None = None,
                     generator: torch.Generator | None = None) -> RejectionResult:
    """Accept or reject every request's drafts and draw its closing token.

    ``target_probs``: [sum(k_i + 1), V], request i's rows in order (one per draft, then the bonus row);
    ``greedy``: [B] bool; ``generators``: request index -> its own generator (seeded requests); ``generator``:
    for the rest (None: torch's global one).
    """
    ks = drafts.num_draft_tokens
    b, vocab = len(ks), target_probs.shape[-1]
    generators = generators or {}
    if target_probs.shape[0] != sum(ks) + b:
        raise ValueError(f"rejection_sample: target_probs has {target_probs.shape[0]} rows, need "
                         f"sum(k) + batch = {sum(ks) + b}")
    starts, bonus = target_rows(ks)
    if bool(greedy.all()):  # the common case: one argmax over every row decides the whole step
        return _greedy(target_probs, drafts, starts)
    dev = target_probs.device
    x = drafts.token_ids.to(dev, torch.long)
    firsts = [s - i for i, s in enumerate(starts)]  # request i's first draft in the flat [sum k] order
    owner = torch.repeat_interleave(torch.arange(b, device=dev), torch.tensor(ks, device=dev, dtype=torch.long))
    # every request before the owner adds one bonus row: draft n sits at target row n + owner
    p_draft = target_probs[torch.arange(x.numel(), device=dev) + owner]  # [N, V]: p_j at each draft
    in_vocab = (x >= 0) & (x < vocab)
    safe_x = torch.where(in_vocab, x, torch.zeros_like(x))
    p_x = torch.where(in_vocab, p_draft.gather(1, safe_x[:, None]).squeeze(1), 0.0)
    if drafts.probs is None:
        q_x = torch.ones_like(p_x)
    else:
        q_x = drafts.probs.to(dev).gather(1, safe_x[:, None]).squeeze(1)
    u = _uniforms(ks, generators, generator, dev)
    # u < p / q without dividing: a draft the proposer gave probability 0 is kept only where the target allows it
    accept = u * q_x.double() < p_x.double()
    greedy_rows = greedy.to(dev)[owner]
    accept = torch.where(greedy_rows, (x == row_argmax(p_draft)) & in_vocab, accept)
    num_accepted = _leading_true(accept, ks)

    # The closing token's distribution: the residual at the first rejection, else p at the bonus row.
    final_rows, residual_at = [], []
    for i, (k, a) in enumerate(zip(ks, num_accepted)):
        final_rows.append(starts[i] + a if a < k else bonus[i])
        residual_at.append(firsts[i] + a if a < k else -1)
    dist = target_probs[torch.tensor(final_rows, device=dev)].double()  # [B, V]
    greedy_list = greedy.tolist()
    # greedy requests close with argmax p: a residual would move the argmax when q is a full distribution
    rejected = [i for i, r in enumerate(residual_at) if r >= 0 and not greedy_list[i]]
    if rejected:
        idx = torch.tensor([residual_at[i] for i in rejected], device=dev)
        if drafts.probs is None:
            q = torch.zeros(len(rejected), vocab, dtype=torch.float64, device=dev)
            ok = in_vocab[idx]
            q[ok.nonzero().squeeze(1), safe_x[idx][ok]] = 1.0
        else:
            q = drafts.probs.to(dev)[idx].double()
        dist[rejected] = residual_distribution(dist[rejected], q)
    closing = _draw(dist, greedy.to(dev), generators, generator)
    out = []
    drafted = x.tolist()
    for i, a in enumerate(num_accepted):
        out.append(drafted[firsts[i]:firsts[i] + a] + [closing[i]])
    return RejectionResult(out, num_accepted)


def _greedy(target: torch.Tensor, drafts: DraftBatch, starts: list[int]) -> RejectionResult:
    """All requests greedy: a draft is accepted while it is its row's argmax, and the step closes with the argmax
    of the row after the last accepted one (the bonus row when all were): what the general path computes (an id
    outside the vocabulary is never an argmax), without its copies of whole rows or a draw from the generator."""
    best = row_argmax(target).tolist()
    drafted = drafts.token_ids.tolist()
    out, num_accepted, at = [], [], 0
    for k, row in zip(drafts.num_draft_tokens, starts):
        a = 0
        while a < k and drafted[at + a] == best[row + a]:
            a += 1
        out.append(drafted[at:at + a] + [best[row + a]])
        num_accepted.append(a)
        at += k
    return RejectionResult(out, num_accepted)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(0, p - q) row by row (unnormalised): what a rejected draft leaves to sample from. Where p == q nothing
    is left (and rejection then had probability 0): p itself, rather than a division by zero."""
    residual = (p - q).clamp_min(0.0)
    return torch.where(residual.sum(-1, keepdim=True) <= 0, p, residual)


def _uniforms(ks: list[int], generators: dict[int, torch.Generator], generator: torch.Generator | None,
              device: torch.device) -> torch.Tensor:
    """[sum k] float64 uniforms: seeded requests from their own generator, the others in one draw."""
    parts: list[torch.Tensor | None] = [None] * len(ks)
    for i, g in generators.items():
        parts[i] = torch.rand(ks[i], dtype=torch.float64, generator=g, device=device)
    rest = sum(k for i, k in enumerate(ks) if parts[i] is None)
    shared = torch.rand(rest, dtype=torch.float64, generator=generator, device=device)
    at, filled = 0, []
    for i, k in enumerate(ks):
        if parts[i] is None:
            filled.append(shared[at:at + k])
            at += k
        else:
            filled.append(parts[i])
    return torch.cat(filled) if filled else torch.zeros(0, dtype=torch.float64, device=device)


def _leading_true(accept: torch.Tensor, ks: list[int]) -> list[int]:
    """Per request, how many of its drafts are accepted before the first rejection."""
    if not ks or max(ks) == 0:
        return [0] * len(ks)
    padded = torch.zeros(len(ks), max(ks), dtype=torch.bool, device=accept.device)
    mask = torch.arange(max(ks), device=accept.device)[None, :] < torch.tensor(ks, device=accept.device)[:, None]
    padded[mask] = accept
    return padded.int().cumprod(1).sum(1).tolist()


def _draw(dist: torch.Tensor, greedy: torch.Tensor, generators: dict[int, torch.Generator],
          generator: torch.Generator | None) -> list[int]:
    """One token per row of the (unnormalised) ``dist``: argmax for greedy rows, else the exponential race
    argmax(dist / E) with E ~ Exp(1), which samples dist / sum(dist)."""
    if bool(greedy.all()):  # no noise to draw (greedy verify steps are the common case)
        return dist.argmax(-1).tolist()
    noise = torch.empty_like(dist).exponential_(generator=generator)
    for i, g in generators.items():
        noise[i].exponential_(generator=g)
    sampled = dist.div(noise).argmax(-1)
    return torch.where(greedy, dist.argmax(-1), sampled).tolist()
