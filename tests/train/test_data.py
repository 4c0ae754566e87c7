"""Batches tied to (seed, step): the same on a resumed run as on an uninterrupted one."""

from __future__ import annotations

import numpy as np

from cinq.train.data import BatchSampler, window_rng


def test_window_rng_depends_only_on_seed_step_and_salt():
    draw = lambda *key: window_rng(*key).random(4).tolist()  # noqa: E731
    assert draw(0, 5, 1) == draw(0, 5, 1)
    assert len({tuple(draw(0, 5, 1)), tuple(draw(0, 5, 2)), tuple(draw(0, 6, 1)), tuple(draw(1, 5, 1))}) == 4


def test_batch_sampler_is_a_function_of_the_step():
    tokens = np.arange(1000, dtype=np.uint16)
    a, b = BatchSampler(tokens, 3, 8, seed=1), BatchSampler(tokens, 3, 8, seed=1)
    assert a.batch(4).tolist() == b.batch(4).tolist() and a.batch(4).shape == (3, 9)
    rows = a.batch(4)
    assert ((rows[:, 1:] - rows[:, :-1]) == 1).all()  # contiguous windows of the corpus
