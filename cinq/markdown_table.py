"""The one markdown table writer (benchmark reports, model cards, `cinq plan`, the results index) and the one way a
cell becomes text. A module of its own, importing nothing of cinq's, so that every room can write a table."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def fmt(value: Any) -> str:
    """A cell as text: floats with 3 significant figures or one decimal, None as "n/a", booleans as yes/no."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """One markdown table, the only writer of them: a header, an alignment line and a row per item (cells through
    ``fmt``; text cells as they are). ``align``: one letter a column, ``l`` or ``r`` (default: the first column
    left, the others right)."""
    align = align or "l" + "r" * (len(columns) - 1)
    if len(align) != len(columns):
        raise ValueError(f"align: {len(align)} letters for {len(columns)} columns")
    lines = ["| " + " | ".join(columns) + " |", "|" + "".join("---:|" if a == "r" else "---|" for a in align)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
