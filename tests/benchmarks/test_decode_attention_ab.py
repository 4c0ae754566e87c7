"""The same-process decode attention A/B: both placements timed, every round times both sides, the speedup is the
median of the per-round ratios, and the 'from memory' placement cycles through as many caches as its budget holds."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.decode_attention_ab import measure
from cinq.kernels.cpu_native import native_module


def test_both_placements_are_timed_and_the_speedup_is_the_median_ratio() -> None:
    module = native_module("paged_decode")
    if module is None:
        pytest.skip("native CPU kernels unavailable here")
    cells = measure(module, module, context=40, threads=1, rounds=3, memory_bytes=1 << 20)
    assert [c["placement"] for c in cells] == ["from memory", "in cache"]
    for c in cells:
        assert c["context"] == 40 and c["kv_kb"] == pytest.approx(2 * 48 * 3 * 64 * 2 / 1e3)  # 3 pages of 16
        assert len(c["ratios"]) == 3 and all(r > 0 for r in c["ratios"])
        assert c["speedup"] == statistics.median(c["ratios"])
