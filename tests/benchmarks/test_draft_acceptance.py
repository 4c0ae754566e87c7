"""Offline greedy acceptance of a draft model: matches equal the chains a served draft would propose."""

from __future__ import annotations

import torch

from benchmarks.draft_acceptance import draft_model_matches, measure_draft, paired_tau_difference, sequence_batches
from cinq.train.generation import generate_naive
from cinq.train.spec_head_data import TargetSequences
from tests.spec.random_target import random_target


def _greedy_chain(draft: torch.nn.Module, prefix: list[int], k: int) -> list[int]:
    seq = list(prefix)
    for _ in range(k):
        logits = draft.compute_logits(draft(torch.tensor([seq])))[0, -1]
        seq.append(int(logits.argmax()))
    return seq[len(prefix):]


def test_matches_follow_the_drafts_own_greedy_chain() -> None:
    target, draft = random_target(seed=0), random_target(seed=1)
    prompt = [3, 14, 15, 9]
    seq = prompt + generate_naive(target, [prompt], 12, 0.0)[0]
    tokens, k = torch.tensor([seq]), 3
    m = draft_model_matches(draft, tokens, k)
    for t in range(len(seq) - 2):
        chain = _greedy_chain(draft, seq[:t + 2], k)
        ok = True
        for j in range(min(k, len(seq) - 2 - t)):
            ok = ok and chain[j] == seq[t + 2 + j]
            # a served chain keeps going only while accepted, so only the accepted prefix must agree
            assert bool(m[0, :j + 1, t].all()) == ok


def test_the_target_as_its_own_draft_accepts_everything() -> None:
    target = random_target(seed=2)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    outs = generate_naive(target, prompts, 10, 0.0)
    seqs = TargetSequences.from_lists([p + o for p, o in zip(prompts, outs)], [len(p) for p in prompts], ["a", "b"])
    r = measure_draft(target, sequence_batches(seqs, batch_size=1), k=3)
    assert r["all"]["accept_rate"] == [1.0, 1.0, 1.0]
    # 10 continuation tokens: the prefill writes one, then steps of 3 drafts + 1 (the last step has 1 draft left)
    assert r["per_sequence"] == [[7, 3], [7, 3]] and list(r["per_language"]) == ["a", "b"]
    same = paired_tau_difference(r["per_sequence"], r["per_sequence"])
    assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0]


def test_the_request_limit_leaves_the_last_token_to_the_target() -> None:
    target = random_target(seed=2)
    prompts = [[1, 2, 3]]
    outs = generate_naive(target, prompts, 10, 0.0)
    seqs = TargetSequences.from_lists([prompts[0] + outs[0]], [3], ["a"])
    r = measure_draft(target, sequence_batches(seqs), k=3, max_tokens=10)
    # as the engine: prefill 1 token, then 3 + 1, 3 + 1, and the last token is a plain decode (no drafts left)
    assert r["per_sequence"] == [[6, 2]] and r["all"]["tau"] == 4.0
