"""The cinq cache: one folder per user for what cinq builds itself (the random fallback model, native kernels).

A module of its own so that low layers (kernels) can find it without importing the models that live in
``cinq.assets``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where cinq writes what it builds itself ($CINQ_CACHE_DIR, default ~/.cache/cinq)."""
    return Path(os.environ.get("CINQ_CACHE_DIR", Path.home() / ".cache" / "cinq"))
