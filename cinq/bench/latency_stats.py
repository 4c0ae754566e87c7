"""Summaries of latency samples (mean, median, p99) as ``vllm bench`` reports them."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank on the sorted samples; nan for no samples."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))]


def summarize_ms(seconds: list[float]) -> dict[str, float]:
    """Mean, median and p99 of samples given in seconds, in milliseconds (nan when there are none)."""
    if not seconds:
        nan = float("nan")
        return {"mean": nan, "median": nan, "p99": nan}
    return {"mean": 1000 * statistics.fmean(seconds), "median": 1000 * statistics.median(seconds),
            "p99": 1000 * percentile(seconds, 99)}
