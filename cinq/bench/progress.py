"""Progress bars for benchmarks: tqdm on stderr, so that stdout keeps only the tables."""

from __future__ import annotations

import sys

from tqdm import tqdm


def progress_bar(total: int, desc: str, enabled: bool = True, unit: str = "req") -> tqdm:
    """A bar over ``total`` items; ``enabled=False`` gives the same object, silent."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr, dynamic_ncols=True,
                leave=False)
