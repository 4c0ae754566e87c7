"""benchmarks/results_table.py: the committed tables are what the results say, a new result file is picked up by
itself, and a run's quiet / draft label is read from what the run recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import results_figures as figures
from benchmarks import results_table as rt


def test_the_committed_tables_are_generated_not_typed() -> None:
    full = (rt.RESULTS / "README.md").read_text()
    assert full == rt.full_table(), "run python benchmarks/results_table.py"
    assert rt.with_headline(rt.README.read_text(), rt.headline_table()) == rt.README.read_text()


def test_the_headline_table_has_at_most_12_rows_the_real_model_first() -> None:
    rows = [line for line in rt.headline_table().splitlines()[2:] if line.startswith("| ")]
    assert 0 < len(rows) <= 12
    assert "SmolLM2" in rows[0]


def test_a_new_result_file_gets_its_row_by_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rt, "RESULTS", tmp_path)
    (tmp_path / "brand_new.json").write_text(json.dumps({"title": "A new benchmark", "headline": "3.00x faster",
                                                          "draft": True}))
    (tmp_path / "notes.md").write_text("# Hand-written notes\n")
    table = rt.full_table()
    row = next(line for line in table.splitlines() if line.startswith("| [brand_new]"))
    assert "3.00x faster" in row and "not registered" in row and row.endswith("| draft |")
    assert "[notes](notes.md)" in table  # a markdown-only result is named as hand-written


@pytest.mark.parametrize("data,md,want", [
    ({"draft": False}, "", "quiet"),
    ({"conditions": "**DRAFT: the machine was shared**"}, "", "draft"),
    ({"conditions": {"a": "Quiet machine: load 0.4", "b": "Quiet machine: load 0.8"}}, "", "quiet"),
    ({"env": {"load_start": 3.2}}, "", "draft"),
    ({"load_average_at_start": 0.5}, "", "quiet"),
    ({"machine": {"load_at_start": 0.4}}, "", "quiet"),
    ({}, "Setup. **Draft numbers**: shared.", "draft"),
    ({}, "Quiet machine: load average 0.52", "quiet"),
    ({}, "no word on the machine", "not recorded"),
    # the CPU's instruction set where the run named it (cinq.plan.cpu.cpu_label), not where prose mentions one
    ({"machine": {"load_at_start": 0.4, "cpu": "AMD EPYC, 2 cores, AVX512-BF16"}}, "", "quiet, AVX512-BF16"),
    ({"draft": True, "cpu": "AMD EPYC, 2 cores, AVX2 + FMA, no AVX512-BF16"}, "", "draft, AVX2 + FMA"),
    ({}, "Quiet machine: load average 0.5 (nothing else running). CPU: Xeon, 2 cores, AMX.", "quiet, AMX"),
    ({}, "Quiet machine: load average 0.5. The AVX512-BF16 kernel is faster.", "quiet"),
])
def test_the_run_label_comes_from_what_the_run_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        data: dict, md: str, want: str) -> None:
    monkeypatch.setattr(rt, "RESULTS", tmp_path)
    (tmp_path / "x.md").write_text(md)
    assert rt.label("x", data) == want


def test_a_figure_typed_from_a_log_says_so() -> None:
    assert rt.label("gpu", rt.load("gpu")) == "from a log"


def test_the_wait_policy_figure_leaves_out_the_benchmark_made_load_and_failed_runs() -> None:
    def row(engine: str, policy: str, tok_s: float | None, load: int = 0, threads: int = 2) -> dict:
        return {"engine": engine, "threads": threads, "policy": policy, "tok_s": tok_s, "under_load": load}
    rows = [row("cinq int4", "PASSIVE", 40.0), row("cinq int4", "ACTIVE", 60.0), row("cinq int4", "SPIN=1000", None),
            row("llama.cpp q4_0", "PASSIVE", 80.0), row("llama.cpp q4_0", "ACTIVE", 120.0),
            row("llama.cpp q4_0", "PASSIVE", 500.0, load=2)]  # not a quiet figure: left out of best vs best
    assert figures.wait_policy({"rows": rows}) == "int4: 60.0 vs 120.0 tok/s (**0.50x**)"
    # each cinq variant against llama.cpp on the same weights, at any thread count and at 1; int4 over bf16
    rows += [row("cinq int4", "ACTIVE", 50.0, threads=1), row("llama.cpp q4_0", "ACTIVE", 25.0, threads=1),
             row("cinq bf16", "PASSIVE", 20.0), row("llama.cpp bf16", "PASSIVE", 10.0)]
    assert figures.wait_policy({"rows": rows}) == ("int4: 60.0 vs 120.0 tok/s (**0.50x**), 1 thr 50.0 vs 25.0 (2.00x); "
                                                   "bf16: 20.0 vs 10.0 tok/s (**2.00x**); cinq int4 / bf16: 3.00x")


def test_a_speculation_figure_starts_at_the_smallest_batch_the_run_measured() -> None:
    def row(method: str, batch: int, speedup: float) -> dict:
        return {"method": method, "batch": batch, "sampling": "greedy", "speedup": speedup, "tau": 1.5,
                "tokens_per_step": 1.4, "decode_speedup": speedup}

    sweep = {"rows": [row("ngram k=4", 4, 0.9), row("ngram k=4", 16, 0.8), row("ngram k=4", 4, 0.7)]}
    assert figures.speculation_real(sweep).startswith("batch 4: ngram k=4 **0.90x**")
    assert figures.speculation_real(sweep).endswith("; batch 16: ngram k=4 0.80x")
    single = {"rows": [row("eagle3 k=3", 1, 1.03), {**row("eagle3 k=3", 1, 2.0), "sampling": "sampled"}]}
    assert figures.speculation_real(single) == ("batch 1: eagle3 k=3 **1.03x** (tau 1.50, 1.40 tokens per step, "
                                                "decode 1.03x)")
    # an adaptive arm that turned speculation off on most steps says so
    off = {"rows": [{**row("ngram adaptive k<=4", 1, 0.98), "k_share": [0.995, 0.005, 0.0]},
                    {**row("ngram adaptive k<=8", 1, 1.5), "k_share": [0.2, 0.8]}]}
    assert figures.speculation_real(off) == ("batch 1: ngram adaptive k<=4 **0.98x** (tau 1.50, 1.40 tokens per step, "
                                             "decode 0.98x, k = 0 on 100% of steps), ngram adaptive k<=8 **1.50x** "
                                             "(tau 1.50, 1.40 tokens per step, decode 1.50x)")
