"""Small texts shipped with cinq so that calibration and perplexity run out of the box: ``calibration.txt`` (from
the corpus's validation split) and ``held_out.txt`` (from its test split), ~64 KB each, every source language of
the corpus interleaved. Where they come from and how they were made: README.md here (``build.py`` remakes them).

``--calib`` / ``--ppl`` take their names, ``calibration`` and ``held-out``, through ``resolve_text_path``."""

from __future__ import annotations

from pathlib import Path

TEXT_DIR = Path(__file__).resolve().parent
EMBEDDED_TEXTS: dict[str, str] = {"calibration": "calibration.txt", "held-out": "held_out.txt"}


def embedded_text_names() -> list[str]:
    """The names ``resolve_text_path`` accepts besides paths."""
    return list(EMBEDDED_TEXTS)


def resolve_text_path(name: str | Path) -> Path:
    """A text argument as a file: an existing file is itself (a user's own file named "calibration" wins); the
    name of an embedded text ("calibration", "held-out"; "held_out" too) is its shipped file; anything else is
    returned unchanged, for the caller to report as missing in its own words."""
    path = Path(name)
    if path.is_file():
        return path
    key = str(name).replace("_", "-")
    if key in EMBEDDED_TEXTS:
        return TEXT_DIR / EMBEDDED_TEXTS[key]
    return path
