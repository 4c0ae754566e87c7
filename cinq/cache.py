"""The cinq cache: one folder per user for what cinq builds itself (the random fallback model, native kernels,
quantized variants, generated training data), and the content hash its entries are keyed by.

A module of its own so that low layers (kernels) can find it without importing the models that live in
``cinq.assets``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    """Where cinq writes what it builds itself ($CINQ_CACHE_DIR, default ~/.cache/cinq)."""
    return Path(os.environ.get("CINQ_CACHE_DIR", Path.home() / ".cache" / "cinq"))


def content_hash(path: Path) -> str:
    """sha256 of what a model's numbers depend on, names and bytes: a GGUF file itself, or a folder's config.json
    and weight files (``*.safetensors``; a folder without config.json: its ``*.gguf``). Cache entries made from a
    model are keyed by it, so a retrained model never finds the old entry; a stray extra weight file only costs a
    miss. Read from the file names alone, not the loader, so that this module stays below every model room."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif (path / "config.json").is_file():
        files = [path / "config.json", *sorted(path.glob("*.safetensors"))]
    else:
        files = sorted(path.glob("*.gguf"))
    h = hashlib.sha256()
    for file in files:
        h.update(file.name.encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()
