"""Standard errors of the accuracies the evaluations report, and of their differences between two models.

Whole-problem accuracy is a mean of independent 0/1 outcomes: SE = sqrt(p (1 - p) / n). Step accuracy is a
ratio p = sum_i y_i / sum_i m_i over problems i with m_i steps of which y_i are right; the steps of one problem
are not independent (one model's weakness on a problem shows in all of its steps), so its SE is the
cluster-robust (sandwich) one with problems as clusters:

    Var(p) = n / (n - 1) * sum_i (y_i - p m_i)^2 / (sum_i m_i)^2

(the simple binomial SE over all steps is given too, for comparison; it is smaller when outcomes cluster).
Two models scored on the same problems are compared *paired*: the SE of a difference uses the per-problem
differences, which is smaller than sqrt(SE_a^2 + SE_b^2) when the models tend to fail the same problems.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def binomial_se(p: float, n: int) -> float:
    """sqrt(p (1 - p) / n); 0 for n = 0."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n > 0 else 0.0


def cluster_ratio_se(hits: Sequence[float], sizes: Sequence[int]) -> float:
    """Cluster-robust SE of sum(hits) / sum(sizes) with one cluster per entry (see the module docstring)."""
    n, total = len(hits), sum(sizes)
    if n < 2 or total <= 0:
        return 0.0
    p = sum(hits) / total
    resid = sum((y - p * m) ** 2 for y, m in zip(hits, sizes))
    return math.sqrt(n / (n - 1) * resid) / total


def paired_diff_se(a: Sequence[float], b: Sequence[float]) -> float:
    """SE of mean(a) - mean(b) for outcomes of the same items: sd(a_i - b_i) / sqrt(n)."""
    n = len(a)
    if n != len(b):
        raise ValueError(f"paired outcomes must have equal lengths, got {n} and {len(b)}")
    if n < 2:
        return 0.0
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / n
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)


def paired_cluster_diff_se(hits_a: Sequence[float], hits_b: Sequence[float], sizes: Sequence[int]) -> float:
    """SE of the difference of two step accuracies on the same problems (clusters): the cluster-robust SE of
    sum(a_i - b_i) / sum(m_i)."""
    if not (len(hits_a) == len(hits_b) == len(sizes)):
        raise ValueError("paired step outcomes must have one entry per problem for both models")
    return cluster_ratio_se([x - y for x, y in zip(hits_a, hits_b)], sizes)
