"""Rejection sampler: unit cases, reproducibility, and the emitted distribution equals the target's.

The distribution tests draw N independent verify steps of a toy target whose distributions do not depend on the
context, so the first emitted token must follow p_1 and, when draft 1 was accepted, the second must follow p_2.
Bound (Bretagnolle-Huber-Carol): for N draws over V categories, P(sum |p_hat - p| >= eps) <= 2^V exp(-N eps^2 / 2);
at delta = 1e-6 that gives TV = eps / 2 <= sqrt((V ln 2 + ln(1/delta)) / (2 N)). A deliberately wrong recovery step
(sampling from p instead of max(0, p - q) after a rejection) is shown to break that bound.
"""

from __future__ import annotations

import math

import pytest
import torch

from cinq.spec import rejection
from cinq.spec.rejection import DraftBatch, rejection_sample

V, K, N = 6, 3, 100_000
DELTA = 1e-6


def tv_bound(n: int, v: int = V) -> float:
    return math.sqrt((v * math.log(2) + math.log(1 / DELTA)) / (2 * n))


def toy(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p [K + 1, V] and q [K, V]: fixed, far apart (q favours what p does not)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2.0 * torch.randn(K + 1, V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(-1.0 * p[:K].log() + 0.5 * torch.randn(K, V, generator=g, dtype=torch.float64), -1)
    return p, q


def run_batch(p: torch.Tensor, q: torch.Tensor | None, drafts: torch.Tensor, seed: int) -> rejection.RejectionResult:
    """N requests, each with K drafts ``drafts`` [N, K] against the same p; q None: one-hot proposer."""
    target = p.repeat(N, 1)  # [N * (K + 1), V], request after request
    probs = None if q is None else q.repeat(N, 1)
    batch = DraftBatch([K] * N, drafts.reshape(-1), probs)
    gen = torch.Generator().manual_seed(seed)
    return rejection_sample(target, batch, torch.zeros(N, dtype=torch.bool), generator=gen)


def tv(samples: list[int], p: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=V).double()
    return 0.5 * (counts / counts.sum() - p).abs().sum().item()


def emitted_distributions(result: rejection.RejectionResult) -> tuple[list[int], list[int]]:
    first = [t[0] for t in result.token_ids]
    second = [t[1] for t, a in zip(result.token_ids, result.num_accepted) if a >= 1]
    return first, second


@pytest.mark.parametrize("one_hot", [False, True])
def test_emitted_tokens_follow_the_target(one_hot: bool) -> None:
    p, q = toy(0)
    g = torch.Generator().manual_seed(1)
    if one_hot:  # a proposer without a distribution: fixed guesses, here each position's second-likeliest token
        drafts = p[:K].argsort(-1, descending=True)[:, 1].repeat(N, 1)
        res = run_batch(p, None, drafts, seed=2)
    else:
        drafts = torch.stack([torch.multinomial(q[j], N, replacement=True, generator=g) for j in range(K)], 1)
        res = run_batch(p, q, drafts, seed=2)
    first, second = emitted_distributions(res)
    assert tv(first, p[0]) <= tv_bound(len(first))
    assert len(second) > 1000 and tv(second, p[1]) <= tv_bound(len(second))


def test_a_grammar_mask_keeps_the_bound_and_forbidden_drafts_never_pass() -> None:
    """Structured outputs: the target's rows are masked (forbidden tokens at probability 0, the rest
    renormalised, as softmax over -inf logits gives) while the proposer, blind to the grammar, favours the
    forbidden tokens. The emitted tokens follow the masked target within the same bound; no forbidden one."""
    p, q = toy(0)
    allowed = torch.ones(K + 1, V, dtype=torch.bool)
    allowed[:, :2] = False  # tokens 0 and 1 forbidden at every position
    p_masked = torch.where(allowed, p, 0.0)
    p_masked = p_masked / p_masked.sum(-1, keepdim=True)
    q_blind = q.clone()
    q_blind[:, :2] += 1.0  # most of the proposer's mass on forbidden tokens
    q_blind = q_blind / q_blind.sum(-1, keepdim=True)
    g = torch.Generator().manual_seed(1)
    drafts = torch.stack([torch.multinomial(q_blind[j], N, replacement=True, generator=g) for j in range(K)], 1)
    first, second = emitted_distributions(run_batch(p_masked, q_blind, drafts, seed=2))
    assert tv(first, p_masked[0]) <= tv_bound(len(first))
    assert len(second) > 1000 and tv(second, p_masked[1]) <= tv_bound(len(second))
    assert not {0, 1} & (set(first) | set(second))


def test_a_wrong_recovery_step_breaks_the_bound(monkeypatch) -> None:
    p, q = toy(0)
    # analytically, recovering from p gives min(p, q) + (1 - sum min(p, q)) p: far from p for this toy
    broken = torch.minimum(p[0], q[0]) + (1 - torch.minimum(p[0], q[0]).sum()) * p[0]
    assert 0.5 * (broken - p[0]).abs().sum().item() > 3 * tv_bound(N)
    g = torch.Generator().manual_seed(1)
    drafts = torch.stack([torch.multinomial(q[j], N, replacement=True, generator=g) for j in range(K)], 1)
    monkeypatch.setattr(rejection, "residual_distribution", lambda p_rows, q_rows: p_rows)
    first, _ = emitted_distributions(run_batch(p, q, drafts, seed=2))
    assert tv(first, p[0]) > tv_bound(N)


def one_request(p: torch.Tensor, drafts: list[int], greedy: bool = False, probs: torch.Tensor | None = None,
                gen: torch.Generator | None = None) -> rejection.RejectionResult:
    return rejection_sample(p, DraftBatch([len(drafts)], torch.tensor(drafts, dtype=torch.long), probs),
                            torch.tensor([greedy]), generators={0: gen} if gen else None)


def test_all_accepted_drafts_get_a_bonus_token() -> None:
    p = torch.eye(V, dtype=torch.float64)[[2, 4, 1, 5]]  # the target is certain of 2, 4, 1, then 5
    res = one_request(p, [2, 4, 1])
    assert res.token_ids == [[2, 4, 1, 5]] and res.num_accepted == [3]


def test_greedy_stops_at_the_first_mismatch_and_emits_argmax() -> None:
    p = torch.softmax(torch.tensor([[0.0, 3, 0, 0, 0, 0], [0, 0, 3, 0, 0, 0], [3, 0, 0, 0, 0, 0],
                                    [0, 0, 0, 3, 0, 0]], dtype=torch.float64), -1)
    res = one_request(p, [1, 4, 0], greedy=True)
    assert res.token_ids == [[1, 2]] and res.num_accepted == [1]


def test_an_empty_draft_samples_the_bonus_row_only() -> None:
    p = torch.eye(V, dtype=torch.float64)[[3]]
    res = one_request(p, [])
    assert res.token_ids == [[3]] and res.num_accepted == [0]


def test_masked_and_out_of_vocabulary_drafts_are_rejected_and_never_emitted() -> None:
    allowed = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0, 0.0], dtype=torch.float64)  # top-k / top-p left two tokens
    p = allowed.repeat(3, 1)
    for drafts in ([0, 1], [V + 7, 3], [-1, 1]):
        for seed in range(20):
            res = one_request(p, drafts, gen=torch.Generator().manual_seed(seed))
            assert res.num_accepted == [0]
            assert res.token_ids[0][-1] in (1, 3)


def test_seeded_requests_repeat_and_ignore_their_batch_mates() -> None:
    p, q = toy(3)
    target = torch.cat([p, p[:2], p])  # request 0: K drafts, request 1: 1 draft, request 2: K drafts
    drafts = torch.tensor([0, 1, 2, 3, 4, 5, 0], dtype=torch.long)

    def run(batch_gen_seed: int, with_mates: bool) -> list[int]:
        g = torch.Generator().manual_seed(11)
        if not with_mates:
            res = rejection_sample(p, DraftBatch([K], drafts[:K], q), torch.tensor([False]), generators={0: g})
            return res.token_ids[0]
        probs = torch.cat([q, q[:1], q])
        res = rejection_sample(target, DraftBatch([K, 1, K], drafts, probs), torch.tensor([False, False, False]),
                               generators={0: g}, generator=torch.Generator().manual_seed(batch_gen_seed))
        return res.token_ids[0]

    alone = run(0, False)
    assert all(run(s, True) == alone for s in range(5))
    assert run(0, False) == alone


def test_row_count_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="rows"):
        rejection_sample(torch.ones(2, V) / V, DraftBatch([2], torch.tensor([0, 1])), torch.tensor([False]))


def test_greedy_closes_with_argmax_even_when_the_draft_distribution_would_move_it() -> None:
    p = torch.tensor([[0.5, 0.4, 0.1, 0, 0, 0], [1.0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    q = torch.tensor([[0.0, 0.0, 1.0, 0, 0, 0]], dtype=torch.float64)  # max(0, p - q) would keep argmax 0...
    q2 = torch.tensor([[0.6, 0.0, 0.4, 0, 0, 0]], dtype=torch.float64)  # ...this one would move it to 1
    for probs in (q, q2):
        res = one_request(p, [2], greedy=True, probs=probs)
        assert res.token_ids == [[0]] and res.num_accepted == [0]


def test_an_all_greedy_step_decides_as_greedy_rows_beside_a_sampled_request() -> None:
    """The all-greedy shortcut (one argmax over the rows) emits what the general path gives the same greedy
    requests when a sampled one shares their step: ties, out-of-vocabulary ids, empty and fully accepted drafts."""
    gen = torch.Generator().manual_seed(3)
    for trial in range(50):
        ks = [int(k) for k in torch.randint(0, 4, (3,), generator=gen)]
        logits = torch.randint(0, 3, (sum(ks) + 3, V), generator=gen).float()  # many ties
        best = logits.argmax(-1)
        drafts = []
        for row, k in zip(rejection.target_rows(ks)[0], ks):
            for j in range(k):  # mostly the argmax (to reach the bonus row), sometimes another id or none at all
                roll = int(torch.randint(0, 6, (), generator=gen))
                drafts.append(int(best[row + j]) if roll < 4 else (V + 2 if roll == 4 else -1))
        batch = DraftBatch(ks, torch.tensor(drafts, dtype=torch.long))
        fast = rejection_sample(logits, batch, torch.ones(3, dtype=torch.bool))
        mixed = rejection_sample(torch.cat([logits, torch.ones(1, V)]),
                                 DraftBatch(ks + [0], batch.token_ids), torch.tensor([True, True, True, False]))
        assert fast.token_ids == mixed.token_ids[:3] and fast.num_accepted == mixed.num_accepted[:3], trial
