"""Batch-mates check: first divergence, and a fp32 engine whose outputs must not depend on its mates."""

from __future__ import annotations

from benchmarks.batch_mates import batch_mates, first_divergence
from cinq.config import EngineConfig


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_rows_count_every_pair(tiny_llama):
    cfg = EngineConfig(model=str(tiny_llama), dtype="float32", num_threads=1, max_model_len=64, seed=0,
                       enable_prefix_caching=False)
    targets = [[10 + i, 20, 30, 40] for i in range(2)]
    pool = [[50 + i, 60, 70] for i in range(5)]
    rows = batch_mates(cfg, targets, pool, (2, 3), max_tokens=3)
    assert [r["batch"] for r in rows] == [2, 3] and all(r["pairs"] == 4 for r in rows)
    assert all(0 <= r["differ"] <= r["pairs"] for r in rows)
