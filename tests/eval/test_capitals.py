"""The capitals data file and its items: well formed, one fact per region, enough held-out problems."""

from __future__ import annotations

from pathlib import Path

import pytest

from cinq.eval.capitals import capital_items, capital_rows
from cinq.eval.fewshot import split_items


def test_data_file_rows_are_distinct_regions_of_known_kinds():
    rows = capital_rows()
    assert len(rows) == 230 and len({r for r, _, _ in rows}) == 230
    facts = {r: c for r, _, c in rows}
    assert facts["France"] == "Paris" and facts["Australia"] == "Canberra" and facts["Texas"] == "Austin"
    assert facts["Canada"] == "Ottawa" and facts["Ontario"] == "Toronto" and facts["Tasmania"] == "Hobart"
    assert all(c.isascii() and r.isascii() for r, _, c in rows)
    assert sum(k == "country" for _, k, _ in rows) >= 150


def test_items_and_held_out_split():
    items = capital_items()
    assert items[0].question == "The capital of Afghanistan is" and items[0].answer == "Kabul"
    assert len(split_items("capitals", items)["test"]) == 172  # >= 150: SEs of about 3.5 points


def test_malformed_line_names_the_line(tmp_path: Path):
    bad = tmp_path / "c.tsv"
    bad.write_text("# comment\nFrance\tcountry\tParis\nSpain country Madrid\n")
    with pytest.raises(ValueError, match="line 3"):
        capital_rows(bad)
