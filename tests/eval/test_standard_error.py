"""Standard errors: the binomial formula, the cluster-robust one for steps clustered by problem, paired diffs."""

from __future__ import annotations

import math
import random

import pytest

from cinq.eval.standard_error import binomial_se, cluster_ratio_se, paired_cluster_diff_se, paired_diff_se


def test_binomial_se_is_sqrt_p_q_over_n():
    assert binomial_se(0.25, 300) == pytest.approx(math.sqrt(0.25 * 0.75 / 300))
    assert binomial_se(0.0, 10) == 0.0 and binomial_se(1.0, 10) == 0.0 and binomial_se(0.5, 0) == 0.0


def test_cluster_se_by_hand_and_against_the_binomial():
    # 3 problems with 2, 3, 1 steps; hits 2, 0, 1 -> p = 1/2; residuals 1, -1.5, 0.5 -> sum of squares 3.5.
    assert cluster_ratio_se([2, 0, 1], [2, 3, 1]) == pytest.approx(math.sqrt(3 / 2 * 3.5) / 6)
    # One step per problem: the cluster SE is the binomial SE with the n / (n - 1) correction (sample variance).
    rng = random.Random(0)
    hits = [int(rng.random() < 0.3) for _ in range(400)]
    p = sum(hits) / 400
    assert cluster_ratio_se(hits, [1] * 400) == pytest.approx(binomial_se(p, 400) * math.sqrt(400 / 399))
    # Steps that succeed or fail together per problem: the simple SE over steps understates the uncertainty.
    together = [3 * int(rng.random() < 0.5) for _ in range(200)]
    p = sum(together) / 600
    assert cluster_ratio_se(together, [3] * 200) > 1.5 * binomial_se(p, 600)


def test_paired_differences():
    a = [1, 0, 1, 1, 0, 1, 0, 0]
    assert paired_diff_se(a, a) == 0.0
    b = [0, 0, 1, 1, 0, 1, 0, 0]  # one problem lost: d = (1, 0, ..., 0), sd = sqrt(1/8), SE = sd / sqrt(8)
    assert paired_diff_se(a, b) == pytest.approx(math.sqrt(1 / 8) / math.sqrt(8))
    # Models failing the same problems: the paired SE is far below the unpaired one.
    rng = random.Random(1)
    base = [int(rng.random() < 0.5) for _ in range(300)]
    worse = [x if rng.random() < 0.95 else 0 for x in base]
    unpaired = math.hypot(binomial_se(sum(base) / 300, 300), binomial_se(sum(worse) / 300, 300))
    assert paired_diff_se(worse, base) < 0.5 * unpaired
    assert paired_cluster_diff_se([2, 1, 3], [2, 1, 3], [3, 3, 3]) == 0.0
    assert paired_cluster_diff_se([1, 1, 3], [2, 1, 3], [3, 3, 3]) > 0.0
    with pytest.raises(ValueError):
        paired_diff_se([1, 0], [1])
