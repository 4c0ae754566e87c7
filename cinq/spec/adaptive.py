"""Adaptive speculation length (``speculative_config.adaptive``): each step, the number of drafts k (0 = off) that
maximises expected output tokens per second at this batch size, from what the engine measured.

Expected tokens a request emits in a step with k drafts: 1 + sum_{i<k} a_i, where a_i is the measured rate at which
a request offered a draft position i (a step with k > i) got a draft there that the target accepted. Per position
and per offer, not per draft: an n-gram drafter finds no match for many requests, and a step that offers 4 positions
to requests that draft none emits one token each, which a per-draft rate would overstate.

A step's cost is measured, as wall time of the runner's execute, per (batch-size bucket, k), as the mean of its
first 1 / ema steps and an exponential moving average after, over decode-only steps (a prefill chunk in the step
would blur it); an arm's first step in a bucket is not counted (new shapes build kernels and caches then), nor is a
step whose proposer caught up over positions committed while a request did not draft (``Proposals.catch_up_s``: an
EAGLE head's or a draft model's pass over the prompt, or over the steps spent at k = 0, paid once when speculation
resumes; ``observe`` gets no seconds and counts its acceptance only). Counted, each re-try of an arm after a stretch
off priced it by the gap it closed, and taking the catch-up's own time out was not enough: the step after it still
read 1.3-1.5x the arm's steady cost (EAGLE-3's k = 1 at batch 4). Throughput is batch * tokens / cost; plain
decoding (k = 0) is one of the arms, so the choice is never knowingly slower than it, and k = 0 proposes nothing
(off costs nothing).

Costs are modelled, not explored per bucket. An engine profiles its target's step at start-up
(cinq/engine/step_profile.py: seconds by rows computed, ``RowCurve``), and an arm is priced ``step cost = s *
(T(rows) + h * k * T(B))``: T the profiled curve at the rows a step of B requests with k drafts computes (B * (1 + k
* f), f the measured share of offered draft positions filled: an n-gram request without a match verifies one row), s
the ratio of measured plain steps to the curve (the machine now against the machine at start-up), and h a draft
position's cost as a share of a plain step at that batch size (a head or draft model scales with the batch as its
target does), from what measured draft arms cost over their rows' price (zero before any was measured: a draft that
costs nothing is the optimistic guess that gets it tried). On this CPU a step's cost is flat up to ~8 rows and
proportional past ~32 (the skinny kernels stream the weights once for up to 32 rows), so no straight line in rows
fits it: a line fitted at small batches priced k = 1 at batch 32 (64 rows, 2x a plain step) as a win, and each
re-try of it, with an EAGLE head's catch-up over 32 prompts, cost what speculation could not win back in a short run
(0.93x). With the curve, an arm whose rows cost more than its tokens are worth is never tried. Without a profile (an
AdaptiveK built alone), ``step cost = a + b * k + c * B * (k + 1)`` (a fixed dispatch cost, a draft cost per
position, the target's cost per verified row), fitted by least squares to every measured arm of every bucket (its
EMA, at the mean batch size it saw). Once the measurements pin the three terms down (arms at two k and rows at two
batch sizes), a bucket's unmeasured arms are priced by the model instead of being tried. Until then a bucket's arms
are tried in increasing k (twice: the first is the warm-up), skipping an arm that cannot win: a step verifying more
drafts costs at least what a shorter one measured, so k is hopeless when its expected tokens over the dearest
shorter arm's cost do not beat the best throughput measured (with the verify step as dear as it is today, low
acceptance stops exploration at k = 1). Nothing about the kernels is assumed: when verify steps get cheaper, the
measured costs say so.

Arms are re-tried now and then (one every ``explore_every`` choices, the one most overdue among arms that could
still win, and without a curve the best arm's neighbours) so that a change in acceptance or load is noticed; an arm
that lost its re-try waits twice as long for the next one (up to ``2 ** max_backoff`` times), and an arm far behind
the best waits (best rate / its rate)^2 times longer still (at most 16x), so a method that does not pay costs little
more than plain decoding. Plain decoding itself is re-tried every ``explore_every`` choices whenever it is not the
best (halfway between the others' re-tries, without backoff), and without a curve measured over ``PLAIN_STEPS``
steps before a bucket's first draft arm: every arm is judged against it, so a mispriced plain arm is the costly
error (one slow measured step held it at ~2x its cost while a losing arm ran for hundreds of steps, each re-try of
plain backing off further), and a re-try of it costs at most what speculation was gaining. A step time above
``OUTLIER`` (2) times the arm's estimate (the OS took the core) counts as that much, and the EMA gives the newest
step a tenth: on this shared 2-core machine ~5% of steps take 1.5-3x, and plain decoding, the arm updated most
often, read dearer than it is after each (an ad hoc simulation of the scenario tests/spec/test_adaptive.py's
test_slow_steps_do_not_let_a_losing_arm_run bounds, at batch 4 with EAGLE-3's measured costs and that jitter: 15% of
steps at a losing k and 0.94x of plain with the old rules, 3% and 0.99x with these). A tighter clip (1.25x) did as
well there but biased arms whose cost is genuinely spread (an n-gram step is cheap when few requests matched) low:
chosen 3x as often as they should be, 0.94x in simulation, and ngram adaptive at batch 4 0.87x in the engine (a
draft run, not kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cinq.spec.row_cost import RowCurve

PRUNE_PRIOR = 2  # offers counted as accepted when judging whether an untried arm could win
MAX_LAG = 16.0  # the most a re-try's wait stretches for an arm far behind the best (see AdaptiveK._lag)
PLAIN_STEPS = 4  # counted plain steps in a bucket before its first draft arm is tried (see AdaptiveK._untried)
OUTLIER = 2.0  # a step's time counts as at most this times its arm's estimate (see AdaptiveK.observe)


def batch_bucket(batch_size: int) -> int:
    """Batch sizes share measurements within a power of two (1, 2, 3-4, 5-8, ...)."""
    return 1 << max(batch_size - 1, 0).bit_length()


@dataclass(slots=True)
class AdaptiveK:
    """Chooses k in [0, k_max] per step; ``observe`` feeds back what the step cost and accepted."""

    k_max: int
    explore_every: int = 32
    max_backoff: int = 5  # a losing arm is re-tried at least every explore_every * 2 ** max_backoff choices
    ema: float = 0.1  # weight of the newest step time (0.2 let one slow step move plain's estimate a fifth)
    margin: float = 0.03  # speculation is chosen only when expected to beat plain decoding by this much
    step_seconds: dict[tuple[int, int], float] = field(default_factory=dict)  # (bucket, k) -> EMA seconds
    step_count: dict[tuple[int, int], int] = field(default_factory=dict)  # (bucket, k) -> steps in its EMA
    warmed: set[tuple[int, int]] = field(default_factory=set)  # arms whose warm-up step was seen
    offered_per_pos: list[int] = field(default_factory=list)  # requests in steps whose k reached the position
    accepted_per_pos: list[int] = field(default_factory=list)
    num_choices: int = 0
    batch_sum: dict[tuple[int, int], float] = field(default_factory=dict)  # (bucket, k) -> sum of batch sizes seen
    batch_count: dict[tuple[int, int], int] = field(default_factory=dict)
    last_chosen: list[int] = field(default_factory=list)  # per arm: the choice number it last ran at
    losses: list[int] = field(default_factory=list)  # per arm: re-tries in a row after which it was not the best
    times_chosen: list[int] = field(default_factory=list)  # per arm: steps it ran (what a report shows)
    row_curve: RowCurve | None = None  # the target's profiled step seconds by rows (cinq/engine/step_profile.py)
    rows_sum: dict[tuple[int, int], float] = field(default_factory=dict)  # (bucket, k) -> rows its steps computed
    slots_offered: int = 0  # draft positions offered (requests x k) in steps with k > 0
    slots_filled: int = 0  # of them, filled with a draft (an n-gram request without a match fills none)
    _probe: int | None = None  # the arm the last re-try ran, judged at the next choice
    _model: tuple[float, float, float] | None = None
    _model_at: int = -1  # len(step_seconds) when _model was fitted

    def __post_init__(self) -> None:
        self.offered_per_pos = [0] * self.k_max
        self.accepted_per_pos = [0] * self.k_max
        self.last_chosen = [0] * (self.k_max + 1)
        self.losses = [0] * (self.k_max + 1)
        self.times_chosen = [0] * (self.k_max + 1)

    def acceptance(self, pos: int, prior: int = 0) -> float:
        """Measured rate at which a request offered draft position ``pos`` (0-based) gets an accepted draft
        there. A position never offered yet takes the rate of the last one measured (a draft is accepted only
        after its predecessors were), or an optimistic 1.0 before any evidence, so that speculation gets
        measured at all. ``prior``: that many offers counted as accepted (an optimistic estimate)."""
        for p in range(pos, -1, -1):
            if self.offered_per_pos[p]:
                return (self.accepted_per_pos[p] + prior) / (self.offered_per_pos[p] + prior)
        return 1.0

    def expected_tokens(self, k: int, prior: int = 0) -> float:
        return 1.0 + sum(self.acceptance(i, prior) for i in range(k))

    def choose(self, batch_size: int, k_cap: int | None = None) -> int:
        """k for a step decoding ``batch_size`` requests (``k_cap``: an upper bound, e.g. from
        ``num_speculative_tokens_per_batch_size``)."""
        top = self.k_max if k_cap is None else min(self.k_max, k_cap)
        self.num_choices += 1
        k = self._untried(batch_size, top)
        if k is None:
            best = self._best(batch_size, top)
            if self._probe is not None:  # the last re-try is measured now: did it win? (plain never backs off)
                self.losses[self._probe] = 0 if best == self._probe or self._probe == 0 else \
                    self.losses[self._probe] + 1
                self._probe = None
            phase = self.num_choices % self.explore_every
            if phase == 0:
                k = self._overdue(batch_size, best, top)
            else:  # plain decoding's own re-try, halfway between the others' (so it never takes their turn)
                k = 0 if best != 0 and phase == self.explore_every // 2 else None
            if k is None:
                k = best
            else:
                self._probe = k
        self.last_chosen[k] = self.num_choices
        self.times_chosen[k] += 1
        return k

    def _untried(self, batch_size: int, top: int) -> int | None:
        """The next arm to measure in this bucket before choosing by throughput, or None."""
        if self.cost_model() is not None:
            return None
        bucket = batch_bucket(batch_size)
        if self.step_count.get((bucket, 0), 0) < PLAIN_STEPS:
            return 0
        best_rate = max((self.expected_tokens(k) / s for (b, k), s in self.step_seconds.items()
                         if b == bucket and k <= top), default=0.0)
        return next((k for k in range(top + 1) if (bucket, k) not in self.step_seconds
                     and self._could_win(batch_size, k, best_rate)), None)

    def _could_win(self, batch_size: int, k: int, best_rate: float) -> bool:
        """Whether arm k might beat ``best_rate`` tokens/s: optimistic acceptance (a few offers must not rule an
        arm out) over its cost, or, unmeasured and unmodelled, over the dearest shorter arm's (a step verifying
        more drafts costs at least that)."""
        bucket = batch_bucket(batch_size)
        if (bucket, k) in self.step_seconds or self.cost_model() is not None:
            floor = self.cost(batch_size, k)
        else:
            floor = max((s for (b, j), s in self.step_seconds.items() if b == bucket and j < k), default=0.0)
        return floor == 0.0 or self.expected_tokens(k, PRUNE_PRIOR) / floor > best_rate

    def _best(self, batch_size: int, top: int) -> int:
        """The arm of the highest expected rate; plain decoding unless speculation beats it by ``margin`` (the
        winner's curse: among noisy estimates, the one that looks best is too often one that got lucky). With a
        profiled curve, nothing is explored in order: acceptance counts ``PRUNE_PRIOR`` offers accepted, so
        that one step's few requests (2 at batch 2, none accepted by chance) do not turn speculation off until
        the next re-try; after a few hundred offers the prior is noise."""
        bucket, priced = batch_bucket(batch_size), self.cost_model() is not None
        prior = PRUNE_PRIOR if self.row_curve is not None else 0
        rates = {k: self.expected_tokens(k, prior) / self.cost(batch_size, k) for k in range(top + 1)
                 if priced or (bucket, k) in self.step_seconds}
        best = max(rates, key=rates.__getitem__)
        return 0 if 0 in rates and rates[best] < rates[0] * (1 + self.margin) else best

    def _overdue(self, batch_size: int, best: int, top: int) -> int | None:
        """The arm whose re-try is most overdue (a loser waits ``explore_every * 2 ** losses``), or None. Only
        arms that could still win are re-tried (a hopeless arm is never paid for), and without a profiled
        ``row_curve`` also the best arm's neighbours: their measured costs are what notices a change in load.
        With the curve, the plain steps re-scale it and acceptance is shared by every batch size; a neighbour
        re-tried regardless (k = 1 at batch 32: 64 rows at 2x a plain step, and with EAGLE-3 a catch-up over 32
        prompts) cost more than a short run at that batch size could win back."""
        best_rate = self.expected_tokens(best) / self.cost(batch_size, best)
        neighbours = self.row_curve is None
        due = {k: self.last_chosen[k] + (self.explore_every << min(self.losses[k], self.max_backoff))
               * self._lag(batch_size, k, best_rate)
               for k in range(top + 1)
               if k != best and ((neighbours and abs(k - best) == 1) or self._could_win(batch_size, k, best_rate))}
        if not due:
            return None
        k = min(due, key=due.__getitem__)
        return k if due[k] <= self.num_choices else None

    def _lag(self, batch_size: int, k: int, best_rate: float) -> float:
        """How much longer than its backoff arm k waits for a re-try: (best rate / its rate)^2, at most
        MAX_LAG. A close second is re-tried about as often as the backoff says; an arm far behind (EAGLE-3 on
        SmolLM2's Q4_1 file at ~0.4x of plain, whose re-try also pays the head's catch-up over every position it
        skipped) rarely, since its acceptance would have to more than double before it could win."""
        if k == 0 or ((batch_bucket(batch_size), k) not in self.step_seconds and self.cost_model() is None):
            return 1.0  # plain decoding (the yardstick), or neither measured nor priced: no rate to judge by
        rate = self.expected_tokens(k) / self.cost(batch_size, k)
        return min(MAX_LAG, max(1.0, (best_rate / rate) ** 2)) if rate > 0 else MAX_LAG

    def cost(self, batch_size: int, k: int) -> float:
        """Step seconds with ``k`` drafts at ``batch_size``: measured in its bucket, else the model's price."""
        measured = self.step_seconds.get((batch_bucket(batch_size), k))
        if measured is not None:
            return measured
        model = self.cost_model()
        if model is None:
            raise ValueError(f"adaptive k: no measurement or model for batch {batch_size}, k = {k}")
        if self.row_curve is not None:
            scale, h, _ = model
            curve = self.row_curve
            return max(scale * (curve(self.expected_rows(batch_size, k)) + h * k * curve(batch_size)), 1e-9)
        a, b, c = model
        return max(a + b * k + c * batch_size * (k + 1), 1e-9)

    def expected_rows(self, batch_size: int, k: int) -> float:
        """Rows a step of ``batch_size`` requests with ``k`` drafts offered computes: each request's known token
        and the drafts it fills (the measured share of offered positions; all of them before any evidence)."""
        fill = self.slots_filled / self.slots_offered if self.slots_offered else 1.0
        return batch_size * (1.0 + k * fill)

    def cost_model(self) -> tuple[float, float, float] | None:
        """With a profiled ``row_curve``: (s, h, 0) of ``s * (T(rows) + h * k * T(B))``, always. Without: (a, b,
        c) of ``a + b * k + c * B * (k + 1)`` fitted to the measured arms, or None while they do not determine all
        three. Refitted when an arm is first measured and every ``explore_every`` choices (EMAs move slowly)."""
        if self._model_at == len(self.step_seconds) and self.num_choices % self.explore_every:
            return self._model
        if self.row_curve is not None:
            self._model_at = len(self.step_seconds)
            self._model = self._profiled_model(self.row_curve)
            return self._model
        keys = list(self.step_seconds)
        x = np.array([[1.0, k, self.batch_sum[(b, k)] / self.batch_count[(b, k)] * (k + 1)] for b, k in keys])
        y = np.array([self.step_seconds[key] for key in keys])
        self._model_at = len(keys)
        self._model = None
        if len(keys) >= 3 and np.linalg.matrix_rank(x) == 3:
            coef = np.linalg.lstsq(x, y, rcond=None)[0]
            self._model = (float(coef[0]), float(coef[1]), float(coef[2]))
        return self._model

    def _profiled_model(self, curve: RowCurve) -> tuple[float, float, float]:
        """(s, h, 0) for the curve: s the measured plain arms' seconds over the curve's price of their rows (1.0
        before any); h what the measured draft arms cost past s * T(their rows), per draft position, as a share
        of a plain step at their batch size (0 before any was measured). One ratio, not a fit per k and batch
        size: arms measured in one bucket do not tell a cost per position from one per request-position (a least
        squares fit of both, from batch sizes 3-4 of one bucket, priced a draft position at 83 ms)."""
        def mean(key: tuple[int, int], total: dict[tuple[int, int], float]) -> float:
            return total[key] / self.batch_count[key]

        plain = [key for key in self.step_seconds if key[1] == 0]
        scale = (sum(self.step_seconds[key] for key in plain) / sum(curve(mean(key, self.rows_sum)) for key in plain)
                 if plain else 1.0)
        drafts = [key for key in self.step_seconds if key[1] > 0]
        extra = sum(self.step_seconds[key] - scale * curve(mean(key, self.rows_sum)) for key in drafts)
        per_position = sum(key[1] * scale * curve(mean(key, self.batch_sum)) for key in drafts)
        return scale, max(extra / per_position, 0.0) if drafts else 0.0, 0.0

    def observe(self, batch_size: int, k: int, seconds: float | None, drafted: list[int],
                accepted: list[int]) -> None:
        """A decode-only step with ``k`` drafts per request took ``seconds``; ``drafted`` / ``accepted``: per
        request, drafts verified and accepted (each request's accepted drafts are its first ones). ``seconds``
        None: the step's cost is not its arm's (its proposer caught up over positions committed while a request
        did not draft); its acceptance counts."""
        for a in accepted:
            for pos in range(min(k, self.k_max)):
                self.offered_per_pos[pos] += 1
                if pos < a:
                    self.accepted_per_pos[pos] += 1
        if k:
            self.slots_offered += len(drafted) * k
            self.slots_filled += sum(drafted)
        key = (batch_bucket(batch_size), k)
        self.rows_sum[key] = self.rows_sum.get(key, 0.0) + len(drafted) + sum(drafted)
        self.batch_sum[key] = self.batch_sum.get(key, 0.0) + batch_size
        self.batch_count[key] = self.batch_count.get(key, 0) + 1
        if seconds is None:
            return
        if key not in self.warmed:
            self.warmed.add(key)
            return
        old = self.step_seconds.get(key)
        if old is not None:  # a step the OS took the core from counts as OUTLIER times the estimate at most
            seconds = min(seconds, OUTLIER * old)
        # The mean of an arm's first 1 / ema steps, then the EMA: with the EMA from the first step on, one slow
        # first step (a page fault, a descheduled core) held an arm that runs rarely (a re-try every few hundred
        # steps) at up to 2x its cost for many re-tries, each moving it by only ema of the gap.
        n = self.step_count.get(key, 0) + 1
        self.step_count[key] = n
        weight = max(self.ema, 1.0 / n)
        self.step_seconds[key] = seconds if old is None else (1 - weight) * old + weight * seconds
