"""Offline greedy acceptance: the speculative walk over known matches, and drafts equal to the heads' argmax."""

from __future__ import annotations

import torch

from cinq.eval.spec_acceptance import draft_matches, measure, measure_ngram, ngram_matches, summarize, walk
from cinq.spec.eagle import new_eagle_head
from cinq.spec.medusa import new_medusa_heads
from tests.spec.random_target import random_target


def test_walk_follows_the_served_steps() -> None:
    k, length, prompt = 2, 9, 3
    m = torch.zeros(k, length, dtype=torch.bool)
    m[0, 2] = m[1, 2] = True  # chain from t = 2 accepts both drafts
    m[0, 5] = True  # t = 5 accepts one
    steps, positions = walk(m, length, prompt, k)
    # the prefill wrote token 3; from t = 2 both drafts (4, 5) pass and the target adds 6; from t = 5 draft 7
    # passes and the target adds 8, the last token
    assert steps == [2, 1]
    assert positions[0] == [True, True] and positions[3] == [True, False] and len(positions) == 5
    assert positions[-1] == [False]  # t = 6: only token 8 is left to draft
    r = summarize(steps, positions, k)
    assert r["tau"] == 2.5 and r["tokens"] == 5 and r["accept_rate"] == [2 / 5, 1 / 4]


def test_medusa_matches_are_each_heads_argmax() -> None:
    target = random_target()
    heads = new_medusa_heads(target, num_heads=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tokens = torch.randint(0, 97, (2, 10))
    m = draft_matches(heads, target, tokens, 2)
    hidden = target(tokens)
    for j in range(2):
        want = heads.head_logits(hidden, j).argmax(-1)[:, :10 - 2 - j] == tokens[:, 2 + j:]
        assert torch.equal(m[:, j, :10 - 2 - j], want) and not m[:, j, 10 - 2 - j:].any()


def test_a_head_that_never_guesses_right_gets_tau_one() -> None:
    target = random_target()
    head = new_eagle_head(target, "eagle")
    tokens = torch.full((1, 12), 5)
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()  # every output is 0: flat logits, argmax 0, never 5
    m = draft_matches(head, target, tokens, 3)
    assert not m.any()
    r = measure(head, target, [(tokens, torch.tensor([12]), torch.tensor([2]), ["en"])], 3)
    assert r["all"]["tau"] == 1.0 and list(r["per_language"]) == ["en"]


def test_prompt_lookup_baseline_on_a_repeating_sequence() -> None:
    tokens = torch.tensor([[7, 1, 2, 3, 1, 2, 3, 1, 2, 3]])
    m = ngram_matches(tokens, torch.tensor([10]), k=2)
    assert not m[0, :, 0].any()  # history [7, 1]: nothing to look up
    assert m[0, :, 4].all()  # history ends in [1, 2], seen before: drafts [3, 1], both right
    r = measure_ngram([(tokens, torch.tensor([10]), torch.tensor([4]), ["xx"])], k=2)
    # t = 3: [3, 1] not seen before, 0 accepted; t = 4: 2 accepted; t = 7: one token left, accepted
    assert r["all"]["tau"] == 2.0 and r["all"]["steps"] == 3
