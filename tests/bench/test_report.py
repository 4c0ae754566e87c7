"""The report: aligned text, markdown with the headline, JSON + markdown + PNG files."""

from __future__ import annotations

import json

from cinq.bench.report import BenchResult, Table, fmt, markdown, text_table, write_report


def result(plot=None) -> BenchResult:
    table = Table("Speed", ["engine", "tok/s"], [["cinq", 250.0], ["baseline", 100.0], ["ratio", 2.5]])
    return BenchResult("demo", "Demo benchmark", "one model, one run", [table], "cinq / baseline = 2.50x",
                       {"tok_s": {"cinq": 250.0, "baseline": 100.0}}, ["a note"], plot)


def test_cells_are_formatted_by_size():
    assert [fmt(v) for v in (1234.5, 12.34, 1.234, None, True, float("nan"), "x", 7)] == [
        "1234", "12.3", "1.23", "n/a", "yes", "n/a", "x", "7"]


def test_text_table_aligns_numbers_right_and_text_left():
    lines = text_table(result().tables[0]).splitlines()
    assert lines[0] == "Speed" and lines[1].split() == ["engine", "tok/s"]
    assert lines[3] == "cinq        250" and lines[5] == "ratio      2.50"


def test_markdown_holds_every_row_the_headline_and_the_notes():
    md = markdown(result())
    assert md.startswith("# Demo benchmark\n\none model, one run\n")
    assert "| baseline | 100 |" in md and "| ratio | 2.50 |" in md
    assert "**cinq / baseline = 2.50x**" in md and md.rstrip().endswith("a note")


def test_write_report_writes_json_markdown_and_the_plot(tmp_path):
    drawn = []

    def plot(fig):
        drawn.append(fig)
        fig.subplots(1, 1).bar(["a"], [1.0])

    paths = write_report(result(plot), tmp_path / "sub" / "demo")
    assert [p.name for p in paths] == ["demo.json", "demo.md", "demo.png"] and len(drawn) == 1
    data = json.loads(paths[0].read_text())
    assert data["kind"] == "demo" and data["headline"] == "cinq / baseline = 2.50x"
    assert data["tok_s"] == {"cinq": 250.0, "baseline": 100.0}
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_plot_function_no_png(tmp_path):
    assert [p.name for p in write_report(result(), tmp_path / "x")] == ["x.json", "x.md"]


def test_run_conditions_label_a_loaded_start_as_a_draft():
    from cinq.bench.report import QUIET_LOAD, run_conditions
    draft, text = run_conditions(QUIET_LOAD + 0.5)
    assert draft and "DRAFT" in text and f"{QUIET_LOAD + 0.5:.2f}" in text
    quiet, text = run_conditions(QUIET_LOAD / 2)
    assert not quiet and "Quiet" in text


def test_publish_prints_then_writes_unless_told_not_to(tmp_path, capsys):
    from cinq.bench.report import publish
    assert publish(result(), None) == [] and not list(tmp_path.iterdir())
    assert "cinq / baseline = 2.50x" in capsys.readouterr().out
    assert [p.name for p in publish(result(), tmp_path / "y")] == ["y.json", "y.md"]
    assert "cinq / baseline = 2.50x" in capsys.readouterr().out
