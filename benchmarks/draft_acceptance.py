"""Greedy acceptance of a draft *model* (``speculative_config`` method ``draft_model``), measured offline on
sequences the target wrote greedily: the draft-model counterpart of cinq/eval/spec_acceptance.py, whose walk
and tally (tau, acceptance per position, per language) it shares.

Draft j of the chain started at position t (right after the target produced token t + 1) is the draft's argmax
after ``tokens[:t + 2 + j]``: while the chain is still accepted its own earlier drafts equal the target's tokens,
and once one is rejected the later ones do not count. So one teacher-forced forward of the draft over each whole
sequence scores every chain at once.

Noise: the sequences are the independent units, so ``paired_tau_difference`` resamples them (bootstrap) to put
an interval on the tau difference of two drafts measured on the same sequences.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cinq.eval.spec_acceptance import Batch, _tally, walk
from cinq.train.spec_head_data import TargetSequences


@torch.no_grad()
def draft_model_matches(draft: Any, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """[B, k, S] bool: greedy draft j of the chain started at t equals ``tokens[:, t + 2 + j]`` (False where that
    token is past the row); right padding beyond a row's length is the caller's to ignore (causal attention keeps
    it from touching real positions)."""
    b, s = tokens.shape
    guess = draft.compute_logits(draft(tokens)).argmax(-1)  # guess[:, i]: the draft's token i + 1
    out = torch.zeros(b, k, s, dtype=torch.bool, device=tokens.device)
    for j in range(k):
        n = s - 2 - j
        if n <= 0:
            break
        out[:, j, :n] = guess[:, 1 + j:1 + j + n] == tokens[:, 2 + j:2 + j + n]
    return out


def sequence_batches(seqs: TargetSequences, batch_size: int = 16) -> list[Batch]:
    """All of ``seqs`` in order as spec_acceptance batches (tokens, lengths, prompt lengths, languages)."""
    out = []
    for start in range(0, len(seqs), batch_size):
        rows = list(range(start, min(start + batch_size, len(seqs))))
        tokens, lengths = seqs.padded(rows)
        out.append((tokens, lengths, torch.from_numpy(seqs.prompt_lens[rows]), [str(seqs.langs[r]) for r in rows]))
    return out


def served_batches(batches: list[Batch], max_tokens: int) -> list[Batch]:
    """``batches`` with each length cut to what a request limited to ``max_tokens`` new tokens can draft for: a
    step drafts at most ``max_tokens - emitted - 1`` tokens (cinq/spec/drafter.py), so on a sequence that
    reached the limit its last token is never drafted (pass the result to ``spec_acceptance.measure_ngram`` to
    score prompt lookup as served, too)."""
    return [(t, torch.minimum(n, p + max_tokens - 1), p, langs) for t, n, p, langs in batches]


def measure_draft(draft: Any, batches: list[Batch], k: int, max_tokens: int | None = None) -> dict[str, Any]:
    """Overall and per-language greedy acceptance of ``draft`` (as ``spec_acceptance.measure``), plus
    ``per_sequence``: [accepted drafts, verify steps] of every sequence, in batch order, for
    ``paired_tau_difference``.

    ``max_tokens``: the served requests' limit (``served_batches``); without it the last step of a sequence that
    reached the limit may draft its final token, which the engine never does (None: spec_acceptance's walk as
    it is)."""
    if max_tokens is not None:
        batches = served_batches(batches, max_tokens)
    matches = [(draft_model_matches(draft, b[0], k), b) for b in batches]
    result = _tally(iter(matches), k)
    per_sequence = []
    for m, (_, lengths, prompt_lens, langs) in matches:
        for r in range(len(langs)):
            steps, _ = walk(m[r], int(lengths[r]), int(prompt_lens[r]), k)
            per_sequence.append([sum(steps), len(steps)])
    result["per_sequence"] = per_sequence
    return result


def paired_tau_difference(a: list[list[int]], b: list[list[int]], n_boot: int = 2000, seed: int = 0
                          ) -> dict[str, float]:
    """tau(a) - tau(b) over the same sequences (``per_sequence`` lists of ``measure_draft``) and its 95%
    bootstrap interval, resampling sequences with the same draw for both (a paired comparison)."""
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if xa.shape != xb.shape or len(xa) == 0:
        raise ValueError("paired_tau_difference needs per-sequence counts of the same, non-empty set of sequences")

    def tau(x: np.ndarray) -> np.ndarray:  # rows: resamples; sums over the resampled sequences
        return 1.0 + x[..., 0].sum(-1) / np.maximum(x[..., 1].sum(-1), 1.0)

    idx = np.random.default_rng(seed).integers(0, len(xa), size=(n_boot, len(xa)))
    diffs = tau(xa[idx]) - tau(xb[idx])
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"diff": float(tau(xa) - tau(xb)), "ci95": [float(lo), float(hi)], "n_sequences": len(xa)}
