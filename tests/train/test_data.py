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


def test_mixed_sampler_draws_rows_in_proportion_and_per_step():
    from cinq.train.data import MixedBatchSampler
    low, high = np.arange(0, 1000, dtype=np.int32), np.arange(50_000, 51_000, dtype=np.int32)
    s = MixedBatchSampler([low, high], [0.75, 0.25], batch_size=64, seq_len=8, seed=3)
    assert s.batch(2).tolist() == MixedBatchSampler([low, high], [3, 1], 64, 8, seed=3).batch(2).tolist()
    rows = np.concatenate([s.batch(step).numpy() for step in range(40)])
    from_high = (rows[:, 0] >= 50_000).mean()
    # 2560 rows at p = 0.25: SE 0.0086, so the bound [0.2, 0.3] is about 6 SE wide on each side.
    assert 0.2 < from_high < 0.3
    assert (((rows >= 50_000).all(axis=1)) | ((rows < 1000).all(axis=1))).all()  # a row never crosses streams
    import pytest

    from cinq.errors import InvalidParameterError
    with pytest.raises(InvalidParameterError, match="weights"):
        MixedBatchSampler([low, high], [0, 0], 4, 8)
