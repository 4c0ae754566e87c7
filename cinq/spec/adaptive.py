"""Adaptive speculation length (``speculative_config.adaptive``): each step, the number of drafts k (0 = off)
that maximises expected output tokens per second at this batch size, from what the engine measured.

Expected tokens a request emits in a step with k drafts: 1 + sum_{i<k} a_i, where a_i is the measured rate at
which a draft at position i is accepted (counted only when the step drafted that far: vLLM's per-position
counters). A step's cost is measured, as wall time of the runner's execute, per (batch-size bucket, k), as an
exponential moving average over decode-only steps (a prefill chunk in the step would blur it); an arm's first
step in a bucket is not counted (new shapes build kernels and caches then). Throughput is batch * tokens /
cost; plain decoding (k = 0) is one of the arms, so the choice is never knowingly slower than it, and k = 0
proposes nothing (off costs nothing).

Costs are modelled, not only explored: ``step cost = a + b * k + c * B * (k + 1)`` (a fixed dispatch cost, a
draft cost per position, the target's cost per verified row), fitted by least squares to every measured arm of
every bucket (its EMA, at the mean batch size it saw). Once the measurements pin the three terms down (arms at
two k and rows at two batch sizes), a bucket's unmeasured arms are priced by the model instead of being tried;
until then arms not yet measured in a bucket are tried (twice: the first is the warm-up) before any is chosen.
Every ``explore_every`` steps the next arm in turn is re-tried so that a change in acceptance or load is noticed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def batch_bucket(batch_size: int) -> int:
    """Batch sizes share measurements within a power of two (1, 2, 3-4, 5-8, ...)."""
    return 1 << max(batch_size - 1, 0).bit_length()


@dataclass(slots=True)
class AdaptiveK:
    """Chooses k in [0, k_max] per step; ``observe`` feeds back what the step cost and accepted."""

    k_max: int
    explore_every: int = 32
    ema: float = 0.2  # weight of the newest step time
    step_seconds: dict[tuple[int, int], float] = field(default_factory=dict)  # (bucket, k) -> EMA seconds
    warmed: set[tuple[int, int]] = field(default_factory=set)  # arms whose warm-up step was seen
    drafted_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)
    num_choices: int = 0
    batch_sum: dict[tuple[int, int], float] = field(default_factory=dict)  # (bucket, k) -> sum of batch sizes seen
    batch_count: dict[tuple[int, int], int] = field(default_factory=dict)
    _model: tuple[float, float, float] | None = None
    _model_at: int = -1  # len(step_seconds) when _model was fitted

    def __post_init__(self) -> None:
        self.drafted_per_pos = [0] * self.k_max
        self.accepted_per_pos = [0] * self.k_max

    def acceptance(self, pos: int) -> float:
        """Measured acceptance rate of a draft at ``pos`` (0-based); optimistic 1.0 before any evidence, so that
        speculation gets measured at all."""
        d = self.drafted_per_pos[pos]
        return self.accepted_per_pos[pos] / d if d else 1.0

    def expected_tokens(self, k: int) -> float:
        return 1.0 + sum(self.acceptance(i) for i in range(k))

    def choose(self, batch_size: int, k_cap: int | None = None) -> int:
        """k for a step decoding ``batch_size`` requests (``k_cap``: an upper bound, e.g. from
        ``num_speculative_tokens_per_batch_size``)."""
        top = self.k_max if k_cap is None else min(self.k_max, k_cap)
        bucket = batch_bucket(batch_size)
        self.num_choices += 1
        model = self.cost_model()
        untried = [k for k in range(top, -1, -1) if (bucket, k) not in self.step_seconds]
        if untried and model is None:
            return untried[0]
        if self.num_choices % self.explore_every == 0:  # re-measure every arm in turn, now and then
            return (self.num_choices // self.explore_every) % (top + 1)
        return max(range(top + 1), key=lambda k: self.expected_tokens(k) / self.cost(batch_size, k))

    def cost(self, batch_size: int, k: int) -> float:
        """Step seconds with ``k`` drafts at ``batch_size``: measured in its bucket, else the model's price."""
        measured = self.step_seconds.get((batch_bucket(batch_size), k))
        if measured is not None:
            return measured
        model = self.cost_model()
        if model is None:
            raise ValueError(f"adaptive k: no measurement or model for batch {batch_size}, k = {k}")
        a, b, c = model
        return max(a + b * k + c * batch_size * (k + 1), 1e-9)

    def cost_model(self) -> tuple[float, float, float] | None:
        """(a, b, c) of ``a + b * k + c * B * (k + 1)`` fitted to the measured arms, or None while they do not
        determine all three (refitted when an arm is first measured; EMAs move slowly between)."""
        if self._model_at == len(self.step_seconds) and self.num_choices % self.explore_every:
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

    def observe(self, batch_size: int, k: int, seconds: float, drafted: list[int], accepted: list[int]) -> None:
        """A decode-only step with ``k`` drafts per request took ``seconds``; ``drafted`` / ``accepted``: per
        request, drafts verified and accepted (each request's accepted drafts are its first ones)."""
        for d, a in zip(drafted, accepted):
            for pos in range(min(d, self.k_max)):
                self.drafted_per_pos[pos] += 1
                if pos < a:
                    self.accepted_per_pos[pos] += 1
        key = (batch_bucket(batch_size), k)
        self.batch_sum[key] = self.batch_sum.get(key, 0.0) + batch_size
        self.batch_count[key] = self.batch_count.get(key, 0) + 1
        if key not in self.warmed:
            self.warmed.add(key)
            return
        old = self.step_seconds.get(key)
        self.step_seconds[key] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds
