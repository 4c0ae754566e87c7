"""Names for data a run generates once and reuses (teacher rationales, teacher-written text, target sequences):
the file name carries a hash of everything that produced the data, so a rerun with the same settings reuses it
and any change (another teacher, corpus, seed, count, temperature...) generates it anew instead of silently
training on data made for other settings."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def settings_key(parts: dict[str, Any]) -> str:
    """A short hash of ``parts`` (JSON-serialisable; key order does not matter)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def file_identity(path: str | Path) -> str | None:
    """The sha256 of a file's bytes (a teacher's weights, a tokenizer), or None when it does not exist."""
    path = Path(path)
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_identity(model_dir: str | Path) -> dict[str, str | None]:
    """What names a model folder in a cache key: its weights and its tokenizer."""
    model_dir = Path(model_dir)
    return {"weights": file_identity(model_dir / "model.safetensors"),
            "tokenizer": file_identity(model_dir / "tokenizer.json")}


def keyed_path(folder: str | Path, stem: str, suffix: str, parts: dict[str, Any]) -> Path:
    """``folder/stem-<key of parts>suffix``."""
    return Path(folder) / f"{stem}-{settings_key(parts)}{suffix}"
