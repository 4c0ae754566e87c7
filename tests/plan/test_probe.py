"""The --measure probe returns figures of the right kind (never asserting how fast)."""

from __future__ import annotations

from cinq.plan.probe import measure


def test_probe_measures_something():
    m = measure(buffer_mib=4, matmul_n=64, repeats=1)
    assert m.bandwidth_gbs > 0 and m.tflops > 0 and m.threads >= 1
