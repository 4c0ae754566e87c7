"""The OpenMP wait-policy A/B: policies parsed to one spelling each and mapped to exactly their variables, and its
report: one table per load condition, a row per (engine, threads) with every policy side by side and each one's
ratio to PASSIVE, the headline on cinq's rows only."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.omp_wait_policy import (child_env, name_failed_rows, parse_loads, parse_policies, report,
                                        roofline)
from cinq.bench.report import markdown


def _row(engine: str, threads: int, policy: str, tok_s: float | None, load: int = 0) -> dict:
    return {"engine": engine, "threads": threads, "policy": policy, "tok_s": tok_s, "under_load": load}


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"variants": "int4", "threads": "1,2", "model": "m", "prompt_len": 128,
                                 "new_tokens": 32, "rounds": 1, "under_load": [0], "repeats": 1,
                                 "engines": "cinq,llama.cpp", **kw})


def test_policies_get_one_spelling_each_in_the_order_given() -> None:
    assert parse_policies("passive, SPIN=10_000,ACTIVE,spin=10000") == ["PASSIVE", "SPIN=10000", "ACTIVE"]
    with pytest.raises(argparse.ArgumentTypeError, match="SPIN=n"):
        parse_policies("PASSIVE,SPIN=fast")


def test_load_conditions_are_counts_of_zero_or_more() -> None:
    assert parse_loads("0,2,2") == [0, 2]
    with pytest.raises(argparse.ArgumentTypeError, match="--under-load"):
        parse_loads("-1")


def test_a_child_gets_exactly_its_policys_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")  # this shell's own: must not leak into a PASSIVE child
    env = child_env("PASSIVE")
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in env
    assert child_env("SPIN=300000")["GOMP_SPINCOUNT"] == "300000"


def test_report_pairs_each_engine_and_thread_count_across_the_policies() -> None:
    rows = [_row("cinq int4", 1, "PASSIVE", 60.0), _row("cinq int4", 1, "ACTIVE", 66.0),
            _row("cinq int4", 1, "SPIN=100000", 63.0),
            _row("llama.cpp q4_0", 1, "PASSIVE", 100.0), _row("llama.cpp q4_0", 1, "ACTIVE", 80.0),
            _row("cinq int4", 2, "PASSIVE", 70.0),  # its other runs missing: no ratios
            _row("cinq int4", 1, "PASSIVE", 30.0, load=2), _row("cinq int4", 1, "ACTIVE", 3.0, load=2),
            _row("cinq int4", 1, "SPIN=100000", None, load=2)]  # a failed child: no speed, no ratio
    result = report(rows, 0.5, _args(under_load=[0, 2]))
    quiet, loaded = result.tables
    assert quiet.columns == ["engine", "threads", "PASSIVE tok/s", "ACTIVE tok/s", "SPIN=100000 tok/s",
                             "ACTIVE / PASSIVE", "SPIN=100000 / PASSIVE"]
    assert quiet.rows == [["cinq int4", 1, 60.0, 66.0, 63.0, 1.1, 1.05],
                          ["llama.cpp q4_0", 1, 100.0, 80.0, None, 0.8, None],
                          ["cinq int4", 2, 70.0, None, None, None, None]]
    assert "under load (2 busy processes" in loaded.title
    assert loaded.rows == [["cinq int4", 1, 30.0, 3.0, None, 0.1, None]]
    assert result.headline == ("cinq decode tok/s vs PASSIVE: cinq int4 1 thr: ACTIVE 1.10x, SPIN=100000 1.05x; "
                               "cinq int4 1 thr under load 2: ACTIVE 0.10x")
    text = markdown(result)
    assert "Quiet machine" in text and "SPIN=100000: OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=100000" in text
    assert "n/a for a speed: that child failed" in text


def test_without_passive_the_ratios_are_to_the_first_policy() -> None:
    rows = [_row("cinq int4", 2, "SPIN=1000", 50.0), _row("cinq int4", 2, "ACTIVE", 75.0)]
    table = report(rows, 0.5, _args()).tables[0]
    assert table.columns[-1] == "ACTIVE / SPIN=1000" and table.rows[0][-1] == 1.5


def test_repeats_give_the_median_speed_and_a_failed_repeat_is_left_out() -> None:
    rows = [_row("cinq int4", 2, "PASSIVE", 40.0), _row("cinq int4", 2, "PASSIVE", 44.0),
            _row("cinq int4", 2, "PASSIVE", 90.0), _row("cinq int4", 2, "ACTIVE", None),
            _row("cinq int4", 2, "ACTIVE", 66.0)]
    assert report(rows, 0.5, _args(repeats=3)).tables[0].rows == [["cinq int4", 2, 44.0, 66.0, 1.5]]


def test_a_failed_child_takes_the_name_its_engine_measured_under() -> None:
    rows = [{"engine_kind": "llama.cpp", "variant": "int4", "engine": "llama.cpp int4", "tok_s": None},
            {"engine_kind": "llama.cpp", "variant": "int4", "engine": "llama.cpp q4_0", "tok_s": 80.0},
            {"engine_kind": "cinq", "variant": "bf16", "engine": "cinq bf16", "tok_s": None}]  # nothing to copy
    assert [r["engine"] for r in name_failed_rows(rows)] == ["llama.cpp q4_0", "llama.cpp q4_0", "cinq bf16"]


def test_the_roofline_is_the_probe_over_the_weight_bytes_and_each_engine_its_best_share() -> None:
    def cinq(policy: str, tok_s: float, probe: float) -> dict:
        return {**_row("cinq bf16", 2, policy, tok_s), "engine_kind": "cinq", "variant": "bf16",
                "weight_bytes": 250_000_000, "probe_gb_s": probe}

    llama = [{**_row("llama.cpp bf16", 2, p, t), "engine_kind": "llama.cpp", "variant": "bf16"}
             for p, t in (("PASSIVE", 40.0), ("ACTIVE", 90.0))]
    loaded = {**cinq("PASSIVE", 500.0, 1.0), "under_load": 2}  # a benchmark-made load: not in the roofline
    rows = [cinq("PASSIVE", 80.0, 30.0), cinq("ACTIVE", 100.0, 20.0), cinq("SPIN=1000", 60.0, 25.0), *llama, loaded]
    # probe: median of 30, 20, 25 GB/s = 25 GB/s over 250 MB a token = 100 tok/s
    assert roofline(rows) == {("bf16", 2): pytest.approx({"weight_mb": 250.0, "probe_gb_s": 25.0,
                                                          "roofline_tok_s": 100.0, "cinq_share": 1.0,
                                                          "llama.cpp_share": 0.9})}
    table = report(rows, 0.5, _args(under_load=[0, 2])).tables[-1]
    assert table.rows == [["bf16", 2, 250.0, 25.0, pytest.approx(100.0), 100.0, 90.0]]


def test_the_roofline_takes_the_bytes_a_step_reads_where_the_child_recorded_them() -> None:
    # an int4 file whose untied bf16 embedding (56 MB) is not read per token: 90 MB a step, not 146
    row = {**_row("cinq int4", 2, "PASSIVE", 200.0), "engine_kind": "cinq", "variant": "int4",
           "weight_bytes": 146_000_000, "step_read_bytes": 90_000_000, "probe_gb_s": 36.0}
    assert roofline([row])[("int4", 2)]["roofline_tok_s"] == pytest.approx(400.0)
    old = {k: v for k, v in row.items() if k != "step_read_bytes"}  # a run from before the field: all the weights
    assert roofline([old])[("int4", 2)]["weight_mb"] == pytest.approx(146.0)
