"""The one markdown table writer: header, alignment line, cells through fmt; a wrong alignment is refused."""

from __future__ import annotations

import pytest

from cinq.markdown_table import fmt, markdown_table


def test_a_table_has_its_header_alignment_and_formatted_cells() -> None:
    text = markdown_table(["model", "tok/s", "note"], [["a", 123.456, None], ["b", 1.5, True]], "lrl")
    assert text.splitlines() == ["| model | tok/s | note |", "|---|---:|---|", "| a | 123 | n/a |",
                                 "| b | 1.50 | yes |"]


def test_the_default_alignment_is_text_first_then_numbers() -> None:
    assert markdown_table(["a", "b", "c"], []).splitlines()[1] == "|---|---:|---:|"


def test_an_alignment_of_the_wrong_width_names_the_columns() -> None:
    with pytest.raises(ValueError, match="2 letters for 3 columns"):
        markdown_table(["a", "b", "c"], [], "lr")


def test_cells_read_as_numbers_of_three_figures() -> None:
    assert [fmt(x) for x in (0.12345, 12.345, 1234.5, float("nan"), "x", 7)] == ["0.12", "12.3", "1234", "n/a",
                                                                                 "x", "7"]
