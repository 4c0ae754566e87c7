"""Host memory policy: keep freed memory in the process instead of handing it back to the OS, and give the
streams a decode step reads (weights, KV caches) memory in 2 MB pages.

glibc serves large allocations with fresh ``mmap`` pages and unmaps them on free, so every step's big temporaries
(gathered contexts, activations of a long prefill) pay page faults and kernel zeroing again — several times the
cost of the copy itself on this class of machine. Raising the mmap and trim thresholds makes freed blocks reusable.
Process-wide: anything else in the process (e.g. a baseline measured in the same run) benefits too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

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


# Transparent huge pages: the size of one, and the kernel's switch for memory that asks (madvise) for them.
HUGE_PAGE_BYTES = 2 << 20
_THP_SWITCH = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_available() -> bool:
    """True where memory can ask for transparent huge pages: Linux with THP set to ``always`` or ``madvise``
    (``CINQ_HUGE_PAGES=0`` turns the engine's use of them off, for A/B measurements)."""
    if os.environ.get("CINQ_HUGE_PAGES", "1").strip() == "0" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(_THP_SWITCH) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def huge_page_tensor(nbytes: int) -> torch.Tensor:
    """A zeroed uint8 tensor of ``nbytes`` on its own anonymous private mapping that asks for 2 MB pages (the
    mapping lives as long as the tensor and its views).

    Why: a decode step streams every weight once, ~100-300 MB, and with 4 KB pages each page of the stream misses
    the TLB; in a VM each miss is a two-level walk. On the 2-core Zen 4 VM a decode step's q4_0 and bf16 weight
    streams read 1.05-1.21x faster from 2 MB pages, and SmolLM2's batch-1 decode ran 1.11x (bf16) and 1.15x (int4,
    2 threads) faster (benchmarks/results/huge_pages.md). Memory from the heap
    (keep_freed_memory() sends every allocation there) never gets them."""
    import torch
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # holds the mapping: unmapped when the last view goes
    start = (-whole.data_ptr()) % HUGE_PAGE_BYTES
    if huge_pages_available():
        span = (len(mapping) - start) // mmap.PAGESIZE * mmap.PAGESIZE
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE, start, span)
        except OSError as e:  # e.g. a kernel without THP: 4 KB pages, still correct
            log.debug("madvise(MADV_HUGEPAGE) refused: %s", e)
    return whole[start:start + nbytes]


def huge_page_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s mapping that sit in huge pages now (from /proc/self/smaps; 0 where unreadable)."""
    addr = t.data_ptr()
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    inside = lo <= addr < hi
                elif inside and head == "AnonHugePages:":
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def kv_cache_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zeroed KV cache tensor: on the CPU in 2 MB pages where available (every decode step reads a sequence's
    pages; at a long context they outweigh a small model's weights), elsewhere ``torch.zeros``."""
    import torch
    if torch.device(device).type != "cpu" or not huge_pages_available():
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = 1
    for n in shape:
        numel *= n
    itemsize = torch.empty((), dtype=dtype).element_size()
    return huge_page_tensor(numel * itemsize).view(dtype).view(shape)
