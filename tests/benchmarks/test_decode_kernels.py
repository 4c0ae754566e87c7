"""benchmarks/decode_kernels.py's report: it renders any --rows the script accepts (a run without M = 1 crashed
its conclusions once, after measuring everything)."""

from __future__ import annotations

import pytest

from benchmarks.decode_kernels import SHAPES, THREADS, render


def run_data(rows: list[int], kernels: tuple[str, ...] = ("bf16", "q4_1 i8")) -> dict:
    """A run's data as main() writes it, with made-up cells: stream rates falling with M."""
    cells = []
    for kernel in kernels:
        for shape, (n, k) in SHAPES.items():
            for th in THREADS:
                for m in rows:
                    gb_s = 20.0 * th / m
                    size = n * k * (2 if kernel == "bf16" else 0.5625)
                    cells.append({"kernel": kernel, "shape": shape, "threads": th, "m": m, "gb_s": gb_s,
                                  "probe_gb_s": 30.0 * th, "ratio": gb_s / (30.0 * th), "bytes": size,
                                  "us_per_call": size / gb_s / 1e3, "torch_gb_s": 5.0 if kernel == "bf16" else None})
    return {"date": "2026-12-07 00:00 UTC", "cpu": "test CPU", "repeats": 2, "load_start": 0.1, "load_end": 0.2,
            "region_us": {"PASSIVE": 12.0}, "dispatch_us": {"pybind": 1.6}, "rows": rows, "cells": cells,
            "kernels": list(kernels), "probe_gb_s": {str(t): 30.0 * t for t in THREADS}}


@pytest.mark.parametrize("rows", [[1, 2, 5, 8], [4], [8, 4]])
def test_report_renders_any_rows(rows):
    text = render(run_data(rows))
    first = min(rows)
    assert f"at M = {first} " in text
    assert ("One decode step's linears at M = 1" in text) == (1 in rows)
    for m in rows:
        assert f"M={m}" in text
