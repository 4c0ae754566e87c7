"""The OMP_WAIT_POLICY A/B's report: one row per (engine, threads) with both policies side by side and their ratio,
the headline on cinq's rows only."""

from __future__ import annotations

import argparse

from cinq.bench.report import markdown
from benchmarks.omp_wait_policy import report


def _row(engine: str, threads: int, policy: str, tok_s: float) -> dict:
    return {"engine": engine, "threads": threads, "policy": policy, "tok_s": tok_s}


def test_report_pairs_each_engine_and_thread_count_across_the_policies() -> None:
    rows = [_row("cinq int4", 1, "PASSIVE", 60.0), _row("cinq int4", 1, "ACTIVE", 66.0),
            _row("llama.cpp q4_0", 1, "PASSIVE", 100.0), _row("llama.cpp q4_0", 1, "ACTIVE", 80.0),
            _row("cinq int4", 2, "PASSIVE", 70.0)]  # its ACTIVE run missing: no ratio
    args = argparse.Namespace(variants="int4", threads="1,2", model="m", prompt_len=128, new_tokens=32, rounds=1)
    result = report(rows, 0.5, args)
    table = result.tables[0].rows
    assert table == [["cinq int4", 1, 60.0, 66.0, 1.1], ["llama.cpp q4_0", 1, 100.0, 80.0, 0.8],
                     ["cinq int4", 2, 70.0, None, None]]
    assert result.headline == "cinq ACTIVE / PASSIVE decode tok/s: 1.10x (cinq int4, 1 thr)"
    assert "Quiet machine" in markdown(result)
