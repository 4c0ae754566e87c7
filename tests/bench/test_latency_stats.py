"""Latency summaries."""

from __future__ import annotations

import math

from cinq.bench.latency_stats import percentile, summarize_ms


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 51.0 and percentile(values, 99) == 99.0 and percentile(values, 100) == 100.0
    assert math.isnan(percentile([], 50))


def test_summary_in_milliseconds():
    s = summarize_ms([0.001, 0.002, 0.003])
    assert s["mean"] == 2.0 and s["median"] == 2.0 and s["p99"] == 3.0
    assert all(math.isnan(v) for v in summarize_ms([]).values())
