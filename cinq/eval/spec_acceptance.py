"""Greedy acceptance of a speculative head, measured offline on sequences the target wrote greedily.

For every position t of a sequence the head drafts a chain of k tokens as it would when served right after the
target produced token t + 1 (EAGLE: chained over its own features, cinq/spec/eagle_unroll.py; Medusa: one head
per depth); draft j is accepted when it and every earlier draft equal the target's greedy tokens t + 2 + j.

``tau`` is what a served greedy request gets per target forward: the walk through each continuation that
speculative decoding makes (start after the prompt; a step emits the accepted drafts plus the target's own
token; the next step starts there), averaged over steps: tau = 1 + mean accepted drafts. ``accept_rate[j]`` is,
over every continuation position, the fraction whose first j + 1 drafts are all accepted.

``measure_ngram`` scores prompt lookup (cinq/spec/ngram.py) on the same sequences, the baseline a trained head
has to beat: a tiny target's greedy text repeats itself, which prompt lookup drafts for free.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from cinq.spec.eagle import EagleHead
from cinq.spec.eagle_unroll import unroll
from cinq.spec.medusa import MedusaHeads
from cinq.spec.ngram import NgramProposer


@torch.no_grad()
def draft_matches(head: EagleHead | MedusaHeads, target: Any, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """[B, k, S] bool: draft j of the chain started at position t equals ``tokens[:, t + 2 + j]`` (False where
    that token is past the row). ``tokens`` [B, S] are whole sequences (padding beyond a row's length is the
    caller's to ignore)."""
    b, s = tokens.shape
    final, states = target.forward_with_hidden_states(tokens)
    out = torch.zeros(b, k, s, dtype=torch.bool, device=tokens.device)
    if isinstance(head, MedusaHeads):
        for j in range(min(k, head.num_heads)):
            if s - 2 - j <= 0:
                break
            draft = head.head_logits(final[:, :s - 2 - j], j).argmax(-1)
            out[:, j, :s - 2 - j] = draft == tokens[:, 2 + j:]
        return out
    feats = head.fuse([states[i] for i in head.feature_layers])
    steps = unroll(head, tokens[:, 1:], feats[:, :-1], k)
    for j, (_, normed) in enumerate(steps):
        n = s - 2 - j  # chains t = 0 .. n-1 have a token to compare at t + 2 + j; step j holds them at rows t + j
        if n <= 0:
            break
        draft = head.compute_logits(normed[:, j:j + n]).argmax(-1)
        out[:, j, :n] = draft == tokens[:, 2 + j:2 + j + n]
    return out


def ngram_matches(tokens: torch.Tensor, lengths: torch.Tensor, k: int, min_n: int = 2, max_n: int = 4
                  ) -> torch.Tensor:
    """As ``draft_matches``, for prompt lookup over each row's tokens up to t + 1."""
    b, s = tokens.shape
    proposer = NgramProposer(k, min_n, max_n)
    out = torch.zeros(b, k, s, dtype=torch.bool)
    for r in range(b):
        row = tokens[r, :int(lengths[r])].tolist()
        index = proposer.index()
        for t in range(len(row) - 2):
            index.extend(row[len(index):t + 2])
            for j, d in enumerate(index.propose()):
                if t + 2 + j >= len(row) or d != row[t + 2 + j]:
                    break
                out[r, j, t] = True
    return out


def walk(matches: torch.Tensor, length: int, prompt_len: int, k: int) -> tuple[list[int], list[list[bool]]]:
    """One sequence's [k, S] matches -> (accepted drafts per served step, per continuation position the
    acceptance of each available draft depth)."""
    m = matches[:, :length].cpu().tolist()
    steps: list[int] = []
    positions: list[list[bool]] = []
    for t in range(max(prompt_len - 1, 0), length - 2):
        k_eff = min(k, length - 2 - t)
        ok, row = True, []
        for j in range(k_eff):
            ok = ok and m[j][t]
            row.append(ok)
        positions.append(row)
    t = max(prompt_len - 1, 0)
    while t + 2 <= length - 1:
        k_eff = min(k, length - 2 - t)
        a = 0
        while a < k_eff and m[a][t]:
            a += 1
        steps.append(a)
        t += a + 1
    return steps, positions


def summarize(steps: list[int], positions: list[list[bool]], k: int) -> dict[str, Any]:
    """tau, accept_rate per draft depth and counts from walks' outputs (see the module docstring)."""
    rates = []
    for j in range(k):
        seen = [row[j] for row in positions if len(row) > j]
        rates.append(sum(seen) / len(seen) if seen else 0.0)
    return {"tau": 1.0 + sum(steps) / len(steps) if steps else 1.0, "steps": len(steps),
            "tokens": sum(steps) + len(steps), "positions": len(positions), "accept_rate": rates}


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]  # tokens [B, S], lengths, prompt_lens, langs


def measure(head: EagleHead | MedusaHeads, target: Any, batches: list[Batch], k: int) -> dict[str, Any]:
    """Overall and per-language acceptance of ``head`` over the batches."""
    return _tally(((draft_matches(head, target, b[0], k), b) for b in batches), k)


def measure_ngram(batches: list[Batch], k: int, min_n: int = 2, max_n: int = 4) -> dict[str, Any]:
    """The same figures for prompt lookup with n-grams of ``min_n``..``max_n`` tokens."""
    return _tally(((ngram_matches(b[0], b[1], k, min_n, max_n), b) for b in batches), k)


def _tally(scored: Any, k: int) -> dict[str, Any]:
    by_lang: dict[str, tuple[list[int], list[list[bool]]]] = defaultdict(lambda: ([], []))
    for matches, (tokens, lengths, prompt_lens, langs) in scored:
        for r, lang in enumerate(langs):
            steps, positions = walk(matches[r], int(lengths[r]), int(prompt_lens[r]), k)
            by_lang[lang][0].extend(steps)
            by_lang[lang][1].extend(positions)
    all_steps = [a for s, _ in by_lang.values() for a in s]
    all_pos = [p for _, ps in by_lang.values() for p in ps]
    return {"k": k, "all": summarize(all_steps, all_pos, k),
            "per_language": {lang: summarize(s, p, k) for lang, (s, p) in sorted(by_lang.items())}}
