"""Adaptive k: on simulated step costs it settles on the throughput-best k per batch size (speculation at batch
1 when drafts are cheap and accepted, off when the batch makes verification expensive); in the engine it keeps
greedy output identical whatever it chooses."""

from __future__ import annotations

import random

import pytest

from cinq import LLM, SamplingParams
from cinq.spec.adaptive import PLAIN_STEPS, AdaptiveK, batch_bucket
from cinq.spec.row_cost import RowCurve


def simulate(adaptive: AdaptiveK, batch: int, cost, accept_rate: float, steps: int, seed: int = 0) -> list[int]:
    """Run ``steps`` choose/observe rounds; a draft at position i is accepted with ``accept_rate`` given the
    previous ones were."""
    rng = random.Random(seed)
    chosen = []
    for _ in range(steps):
        k = adaptive.choose(batch)
        chosen.append(k)
        accepted = []
        for _ in range(batch):
            a = 0
            while a < k and rng.random() < accept_rate:
                a += 1
            accepted.append(a)
        adaptive.observe(batch, k, cost(batch, k), [k] * batch, accepted)
    return chosen


def dispatch_bound(batch: int, k: int) -> float:
    """A CPU-like step: a fixed dispatch cost, a draft cost per position, and compute per row."""
    return 5e-3 + 3e-4 * k + 1e-4 * batch * (k + 1)


def test_speculates_at_batch_one_and_turns_off_for_a_large_batch() -> None:
    adaptive = AdaptiveK(k_max=4)
    small = simulate(adaptive, 1, dispatch_bound, accept_rate=0.8, steps=200)
    large = simulate(adaptive, 512, dispatch_bound, accept_rate=0.8, steps=200, seed=1)
    # batch 1: a draft position costs 0.4 ms on a ~5 ms step and adds 0.8^i tokens: k = 4 is the best arm
    assert max(set(small[-100:]), key=small[-100:].count) == 4
    # batch 512: rows dominate (51 ms per extra position, for at most 0.8 more tokens on a 56 ms step): off
    assert max(set(large[-100:]), key=large[-100:].count) == 0


def test_low_acceptance_turns_speculation_off_even_at_batch_one() -> None:
    chosen = simulate(AdaptiveK(k_max=4), 1, dispatch_bound, accept_rate=0.05, steps=200)
    assert max(set(chosen[-100:]), key=chosen[-100:].count) == 0


def test_arms_are_measured_in_increasing_k_and_re_explored() -> None:
    adaptive = AdaptiveK(k_max=3, explore_every=10)
    chosen = simulate(adaptive, 2, dispatch_bound, accept_rate=0.9, steps=100)
    # plain first (warm-up, then PLAIN_STEPS measured), then each draft arm twice (warm-up, then measured)
    assert chosen[:1 + PLAIN_STEPS + 6] == [0] * (1 + PLAIN_STEPS) + [1, 1, 2, 2, 3, 3]
    assert {(batch_bucket(2), k) for k in range(4)} <= set(adaptive.step_seconds)
    assert set(chosen[9:100:10]) - {3}  # the periodic re-try of a losing arm


def test_a_hopeless_arm_is_never_tried() -> None:
    """With the verify step as dear as on the CPU today (a 2-row step costs 1.7 decode steps) and drafts rarely
    accepted, k = 2.. cannot pay whatever it costs beyond k = 1: exploration stops at k = 1 (a broken pruning
    would try k = 2, 3, 4 and fail the set check), and re-tries never pay for them either."""
    adaptive = AdaptiveK(k_max=4, explore_every=8)
    chosen = simulate(adaptive, 8, lambda b, k: 1.0 if k == 0 else 1.5 + 0.2 * k, accept_rate=0.1, steps=500)
    assert chosen[:2 + PLAIN_STEPS] == [0] * (1 + PLAIN_STEPS) + [1]
    # nor re-tried: only k = 1, the best arm's neighbour, now and then
    assert set(chosen) == {0, 1} and chosen[3 + PLAIN_STEPS:].count(1) <= 12


def test_re_tries_of_a_losing_arm_back_off() -> None:
    """Off where speculation does not pay costs little: a losing arm's re-tries double their gap each time,
    so 2000 steps re-try far fewer times than a fixed period would (2000 / 32 = 62)."""
    adaptive = AdaptiveK(k_max=1, explore_every=32, max_backoff=5)
    chosen = simulate(adaptive, 1, lambda b, k: 1.0 + k, accept_rate=0.2, steps=2000)
    assert chosen[-1000:].count(1) <= 1000 // (32 << 5) + 1
    assert 2 <= chosen.count(1) <= 12


def test_an_arm_far_behind_is_re_tried_less_often_than_a_close_one() -> None:
    """Re-tries wait longer the further an arm trails: k = 1 at 0.4x of plain's rate (a 3x dearer step, as an
    EAGLE-3 re-try with its catch-up measured on SmolLM2's file) is re-tried at most half as often as one at 0.9x,
    under the same backoff; without the stretch (a broken _lag) both would be re-tried alike."""
    counts = {}
    for name, k1_cost in (("far", 3.0), ("close", 1.3)):
        adaptive = AdaptiveK(k_max=1, explore_every=8, max_backoff=2)
        chosen = simulate(adaptive, 1, lambda b, k, c=k1_cost: c if k else 1.0, accept_rate=0.2, steps=3000)
        counts[name] = chosen[100:].count(1)
    assert 0 < 2 * counts["far"] <= counts["close"], counts


def test_speculation_turns_back_on_when_acceptance_rises() -> None:
    adaptive = AdaptiveK(k_max=4, explore_every=8, max_backoff=2)
    cost = lambda b, k: 1.0 + 0.3 * k  # noqa: E731
    off = simulate(adaptive, 1, cost, accept_rate=0.05, steps=200)
    assert off[-50:].count(0) >= 40
    on = simulate(adaptive, 1, cost, accept_rate=0.95, steps=600, seed=3)
    assert max(set(on[-100:]), key=on[-100:].count) == 4


def test_acceptance_counts_offered_positions_not_drafts() -> None:
    """An n-gram step offers k positions; a request that found no match drafts none and emits one token, so a
    position's rate is over the requests offered it: half the requests drafting (all accepted) is 0.5."""
    adaptive = AdaptiveK(k_max=2)
    adaptive.observe(4, 2, 1.0, [2, 2, 0, 0], [2, 2, 0, 0])
    assert adaptive.acceptance(0) == adaptive.acceptance(1) == 0.5
    assert adaptive.expected_tokens(2) == 2.0


def test_batch_buckets_are_powers_of_two() -> None:
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 64]


def test_adaptive_engine_keeps_greedy_output(tiny_llama) -> None:
    prompts = ["abcabcabc", "hello hello hello", "the cat and the cat and", "0101010101"]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32").generate(prompts, params)]
    for spec in ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "adaptive": True},
                 {"model": str(tiny_llama), "num_speculative_tokens": 3, "adaptive": True}):
        llm = LLM(str(tiny_llama), dtype="float32", speculative_config=spec)
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain
        assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_the_cost_model_prices_a_new_batch_size_without_trying_every_arm() -> None:
    adaptive = AdaptiveK(k_max=4, explore_every=1000)  # no periodic re-try in this test
    simulate(adaptive, 1, dispatch_bound, accept_rate=0.8, steps=40)  # every arm at batch 1
    assert adaptive.cost_model() is None  # one batch size: dispatch and per-row costs are not told apart
    simulate(adaptive, 64, dispatch_bound, accept_rate=0.8, steps=4)  # two arms at batch 64
    a, b, c = adaptive.cost_model()
    assert (a, b, c) == (pytest.approx(5e-3), pytest.approx(3e-4), pytest.approx(1e-4))
    chosen = simulate(adaptive, 512, dispatch_bound, accept_rate=0.8, steps=30, seed=2)
    # batch 512 is priced by the model: plain decoding from the first step, no arm tried for nothing
    assert chosen == [0] * 30
    assert {k for (bucket, k) in adaptive.step_seconds if bucket == batch_bucket(512)} == {0}


def test_a_marginal_gain_stays_off() -> None:
    """Speculation expected 1 % faster (within the 3 % margin) stays off; 10 % faster turns on."""
    for gain, expect in ((1.01, 0), (1.10, 1)):
        adaptive = AdaptiveK(k_max=1, explore_every=1000)
        for _ in range(1 + PLAIN_STEPS):  # plain's warm-up and measured steps
            adaptive.observe(1, 0, 1.0, [0], [0])
        adaptive.observe(1, 1, 1.0, [1], [1])  # warm-up; acceptance 1.0 at position 0: 2 tokens per step
        adaptive.observe(1, 1, 2.0 / gain, [1], [1])
        assert adaptive.choose(1) == expect


def test_slow_steps_do_not_let_a_losing_arm_run() -> None:
    """On this shared 2-core machine step times jitter (~10%) and ~5% of steps take 1.5-3x (the OS took the core).
    With EAGLE-3's measured costs at batch 4 (k = 1 1.94x a plain step for 1.54 tokens: a loser), a plain arm
    read dear after such steps let k = 1 run for hundreds of steps: 15% of 750 steps at k > 0 on average over these
    seeds with the old rules (plain measured once, its re-tries backing off like any loser's, an EMA weight of a
    fifth), 0.94x of plain's throughput. Bound: at most 5% of steps at k > 0 on average (the first measurements
    and the re-tries take ~3%)."""
    shares = []
    for seed in range(10):
        rng = random.Random(seed + 1000)

        def cost(b: int, k: int) -> float:
            base = 1.0 if k == 0 else 1.94 + 0.45 * (k - 1)
            slow = rng.uniform(1.5, 3.0) if rng.random() < 0.05 else 1.0
            return base * rng.lognormvariate(0, 0.1) * slow

        chosen = simulate(AdaptiveK(k_max=4), 4, cost, accept_rate=0.54, steps=750, seed=seed)
        shares.append(sum(k > 0 for k in chosen) / len(chosen))
    assert sum(shares) / len(shares) <= 0.05, shares


def test_plain_is_re_tried_while_speculation_wins() -> None:
    """A plain arm mispriced once (its one measured step at 3x) is measured again within explore_every choices
    while speculation looks best, without backoff: its estimate comes down and plain wins back where it should."""
    adaptive = AdaptiveK(k_max=1, explore_every=16)
    adaptive.observe(1, 0, 1.0, [0], [0])  # warm-up
    for seconds in (3.0, *[1.0] * (PLAIN_STEPS - 1)):
        adaptive.observe(1, 0, seconds, [0], [0])  # mean 1.5 after PLAIN_STEPS: dearer than k = 1's 1.4 per token
    chosen = simulate(adaptive, 1, lambda b, k: 1.0 if k == 0 else 1.4, accept_rate=0.0, steps=400)
    assert chosen[-100:].count(0) >= 95


def test_one_slow_first_step_does_not_hold_an_arm_dear() -> None:
    """An arm's first counted step at 2x its cost, then four at its cost: the estimate is their mean (1.2), where
    an EMA seeded by the first step would still read 1 + 0.8^4 = 1.41 (what held plain decoding at ~1.8x its cost
    in a sweep, its re-tries each moving it by a fifth of the gap)."""
    adaptive = AdaptiveK(k_max=1)
    adaptive.observe(1, 0, 5.0, [0], [0])  # warm-up: not counted
    for seconds in (2.0, 1.0, 1.0, 1.0, 1.0):
        adaptive.observe(1, 0, seconds, [0], [0])
    assert adaptive.step_seconds[(1, 0)] == pytest.approx(1.2)
    for _ in range(50):  # then the EMA: a lasting change in cost is followed
        adaptive.observe(1, 0, 1.5, [0], [0])
    assert adaptive.step_seconds[(1, 0)] == pytest.approx(1.5, rel=0.01)


def test_with_prompt_lookup_first_only_prompt_rows_are_left_out_of_an_arms_cost() -> None:
    """A catch-up's rows past drafts + 1 were committed without the proposer: with speculation off (a one-time
    price, left out) or, with prompt lookup first, by lookup-drafted steps (the arm's own steady cost: charged).
    The prompt's rows are left out either way."""
    from cinq.spec.proposer import stale_rows
    rows, drafts, prompt = [10, 6, 2], [2, 3, 1], [7, 0, 0]  # past drafts + 1: 7, 2, 0
    assert stale_rows(rows, drafts, prompt, charge_gaps=False) == 9
    assert stale_rows(rows, drafts, prompt, charge_gaps=True) == 7


def cpu_rows(rows: float) -> float:
    """A CPU-like target step by rows: flat to 8 rows (the weights streamed once), in proportion past them."""
    return 10e-3 * max(1.0, rows / 8)


def cpu_step(batch: int, k: int) -> float:
    """That target verifying ``batch * (k + 1)`` rows, and a head costing 5% of a plain step per draft."""
    return cpu_rows(batch * (k + 1)) + 0.05 * k * cpu_rows(batch)


def profiled(k_max: int, **kw) -> AdaptiveK:
    """An AdaptiveK with a start-up profile of ``cpu_rows`` at step_profile's row counts."""
    from cinq.engine.step_profile import PROFILE_ROWS
    return AdaptiveK(k_max=k_max, row_curve=RowCurve.of({r: cpu_rows(r) for r in PROFILE_ROWS}), **kw)


def test_with_a_profiled_curve_an_arm_whose_rows_cost_too_much_is_never_tried() -> None:
    """Batch 32: k = 1 verifies 64 rows, 2x a plain step, for at most 1.6 tokens: priced by the profiled curve it
    is never run, not even once to learn so. A straight line in rows, fitted at batch 1-2 where steps are flat,
    prices it as a win: without the curve (the broken variant) it is tried."""
    adaptive = profiled(4)
    small = simulate(adaptive, 1, cpu_step, accept_rate=0.6, steps=200)
    assert max(set(small[-100:]), key=small[-100:].count) >= 2  # flat to 8 rows: speculation pays at batch 1
    assert simulate(adaptive, 32, cpu_step, accept_rate=0.6, steps=300, seed=1) == [0] * 300
    line = AdaptiveK(k_max=4)
    for batch in (1, 2):
        simulate(line, batch, cpu_step, accept_rate=0.6, steps=200)
    assert any(simulate(line, 32, cpu_step, accept_rate=0.6, steps=300, seed=1))


def test_with_a_profiled_curve_speculation_starts_without_exploring_and_prices_drafts_by_their_cost() -> None:
    """No plain steps or per-k exploration first: the curve prices every arm, drafts at no cost until measured
    (the optimistic guess); the measured arms then give the draft's cost per position as a share of a plain
    step (5% here) and the plain steps the curve's scale."""
    adaptive = profiled(4, explore_every=1000)
    chosen = simulate(adaptive, 2, cpu_step, accept_rate=0.7, steps=60)
    # acceptance 1.0 before evidence: k = 3 (8 rows, flat) and k = 4 (10 rows, 1.25x) tie at 4 tokens per 10 ms
    # a request; the shorter first
    assert chosen[0] == 3
    scale, share, _ = adaptive.cost_model()
    assert scale == 1.0  # never measured plain: the curve as profiled
    assert share == pytest.approx(0.05)
    assert adaptive.cost(64, 2) == pytest.approx(cpu_step(64, 2))  # an unmeasured batch size, priced right


def test_a_step_that_caught_up_counts_its_acceptance_not_its_cost() -> None:
    adaptive = AdaptiveK(k_max=2)
    for _ in range(3):  # warm-up, then a measured step at 1 s
        adaptive.observe(1, 1, 1.0, [1], [1])
    adaptive.observe(1, 1, None, [1], [0])  # a re-try after a stretch off: its cost is not the arm's
    assert adaptive.step_seconds[(1, 1)] == 1.0
    assert adaptive.acceptance(0) == pytest.approx(3 / 4)


def test_the_fill_share_prices_an_n_gram_arm_by_the_rows_it_verifies() -> None:
    """Requests without a match draft nothing and verify one row: the expected rows follow the measured share of
    offered positions filled."""
    adaptive = profiled(4)
    assert adaptive.expected_rows(8, 4) == 40  # before any evidence: every position filled
    adaptive.observe(8, 4, None, [4, 0, 0, 0, 4, 0, 0, 0], [1] * 2 + [0] * 6)
    assert adaptive.expected_rows(8, 4) == 8 * (1 + 4 * 0.25)
