"""Keep freed host memory in the process instead of handing it back to the OS.

glibc serves large allocations with fresh ``mmap`` pages and unmaps them on free, so every step's big temporaries
(gathered contexts, activations of a long prefill) pay page faults and kernel zeroing again — several times the
cost of the copy itself on this class of machine. Raising the mmap and trim thresholds makes freed blocks reusable.
Process-wide: anything else in the process (e.g. a baseline measured in the same run) benefits too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def keep_freed_memory() -> bool:
    """Tune glibc malloc once per process; False where it is not glibc (then nothing changes)."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))
    except (OSError, AttributeError):
        ok = False
    _done = ok
    if not ok:
        log.debug("mallopt unavailable: leaving the allocator as it is")
    return ok
