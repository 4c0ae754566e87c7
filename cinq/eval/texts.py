"""Text files the evaluations read (perplexity and calibration text): plain text, or the ``text`` fields of a
.jsonl corpus split (data/corpus/test.jsonl) joined by blank lines.

A corpus split is laid out source by source (English first, code and arithmetic last), so a length-limited
read takes every k-th document across the whole file rather than its first ones: the text then samples every
language and source in proportion, as the split does."""

from __future__ import annotations

import json
from pathlib import Path

from cinq.errors import InvalidParameterError


def read_text(path: str | Path, max_chars: int | None = None, field: str = "ppl") -> str:
    """The text of ``path``, at most ``max_chars`` characters (None: all of it); errors name the option
    ``field``."""
    from cinq.assets.text import resolve_text_path
    path = resolve_text_path(path)  # "calibration" / "held-out": the texts shipped with cinq
    option = f"--{field.replace('_', '-')}"
    if not path.is_file():
        raise InvalidParameterError(f"{option}: {path} is not a readable file", field)
    if path.suffix != ".jsonl":
        text = path.read_text(encoding="utf-8", errors="replace")
        return text[:max_chars] if max_chars else text
    docs = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                docs.append(str(json.loads(line)["text"]))
            except (ValueError, KeyError, TypeError):
                raise InvalidParameterError(f"{option}: {path} line {n} is not a JSON object with a \"text\" "
                                            f"field", field) from None
    total = sum(len(d) + 2 for d in docs)
    step = max(1, total // max_chars) if max_chars else 1
    text = "\n\n".join(docs[::step])
    return text[:max_chars] if max_chars else text
