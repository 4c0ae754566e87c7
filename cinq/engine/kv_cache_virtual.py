"""Virtual-contiguous KV cache (vAttention, arXiv 2405.04437): the paged cache's alternative layout.

Instead of a pool of blocks read through block tables, every running request owns a *slot*: for each layer, one
contiguous virtual range for its keys and one for its values, each ``slot_tokens`` (>= max_model_len) tokens
long. The whole reservation is one anonymous ``mmap`` with ``MAP_NORESERVE``: it costs address space, not memory.
The kernel commits a physical page the first time a token's K/V lands on it, and ``madvise(MADV_DONTNEED)``
hands the pages back when the request finishes or is preempted. Attention then reads ``kv_cache[0, slot,
:seq_len]`` as a plain strided view: no block table (``cinq.kernels.contiguous``).

Bookkeeping mirrors ``kv_cache.KVCacheManager`` (the scheduler calls the same methods): the budget is a number of
*pages* (the same memory limit as the paged pool, divided by the page size), and a request holding n tokens is
charged, for each of its 2 * num_layers ranges, the pages those n tokens touch. Its "block table" is ``[slot]``
and the runner's block size is ``slot_tokens``, so the step's slot mapping, the KV writer and the metadata are
the paged ones unchanged.

Prefix sharing is not done here: sharing physical pages between requests needs a memfd and one
``mmap(MAP_FIXED)`` per shared page run per range (2 * num_layers per run) and only works at a granularity where a
page holds whole tokens; ``benchmarks/vattention.py`` measures why that does not pay (see its results file).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from cinq.engine.kv_cache import PrefixCacheStats
from cinq.errors import InvalidParameterError
from cinq.step.request import Request
from cinq.step.scheduler_output import ScheduledSeq

SMALL_PAGE = mmap.PAGESIZE  # 4 KiB on x86-64
HUGE_PAGE = 2 << 20  # a transparent huge page (x86-64 PMD size)
_PROT_RW = 0x1 | 0x2
_MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_NORESERVE = 0x02, 0x20, 0x4000
_MADV_DONTNEED, _MADV_HUGEPAGE, _MADV_NOHUGEPAGE = 4, 14, 15
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"kv_cache_layout virtual: {what} failed: {os.strerror(err)}")


def slot_tokens_for(max_model_len: int, row_bytes: int, page_size: int) -> int:
    """Tokens per slot: max_model_len rounded up so that one range (tokens x ``row_bytes``) is a whole number of
    pages (every range then starts on a page boundary and is released page by page)."""
    step = page_size // math.gcd(page_size, row_bytes)
    return -(-max_model_len // step) * step


def pages_for(num_tokens: int, row_bytes: int, page_size: int) -> int:
    """Pages one range commits once its first ``num_tokens`` tokens are written."""
    return -(-num_tokens * row_bytes // page_size)


@dataclass(slots=True, frozen=True)
class VirtualKVSpec:
    """The shape of a virtual layout, decided by the engine core and handed to the runner."""

    num_slots: int  # requests that can hold a range at once (max_num_seqs)
    slot_tokens: int  # length of every range, >= max_model_len (the runner's "block size")
    page_size: int  # SMALL_PAGE or HUGE_PAGE


class VirtualKVRegion:
    """One reservation [num_layers, 2, num_slots, slot_tokens, Hkv, D] in virtual memory, committed on first write.

    ``layer_views()`` are torch tensors over it (no copy), shaped as the paged cache with ``num_slots`` blocks of
    ``slot_tokens``. The mapping lives as long as any view does (the views keep this object alive).
    """

    def __init__(self, num_layers: int, num_slots: int, slot_tokens: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, page_size: int = SMALL_PAGE) -> None:
        if page_size not in (SMALL_PAGE, HUGE_PAGE):
            raise InvalidParameterError(f"page_size must be {SMALL_PAGE} or {HUGE_PAGE}, got {page_size}",
                                        "page_size")
        self.num_layers, self.num_slots, self.slot_tokens = num_layers, num_slots, slot_tokens
        self.page_size, self.dtype = page_size, dtype
        self.shape = (num_layers, 2, num_slots, slot_tokens, num_kv_heads, head_dim)
        self.row_bytes = num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        self.range_bytes = slot_tokens * self.row_bytes
        if self.range_bytes % page_size:
            raise InvalidParameterError(
                f"slot_tokens {slot_tokens} x {self.row_bytes} B is not a whole number of {page_size} B pages "
                f"(use slot_tokens_for)", "slot_tokens")
        self.nbytes = num_layers * 2 * num_slots * self.range_bytes
        # Over-reserve one page so the base can be aligned to it (mmap only promises 4 KiB alignment); nothing is
        # committed, so the slack costs address space only.
        self._map_len = self.nbytes + page_size
        addr = _libc.mmap(None, self._map_len, _PROT_RW, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"kv_cache_layout virtual: reserving {self._map_len / 2**30:.1f} GiB of address "
                               f"space failed: {os.strerror(err)}")
        self._map_addr = addr
        self.base = -(-addr // page_size) * page_size
        # THP only where asked for: 2 MiB pages commit 512x more per first touch (measured in the benchmark).
        _check(_libc.madvise(self.base, self.nbytes, _MADV_HUGEPAGE if page_size == HUGE_PAGE else _MADV_NOHUGEPAGE),
               "madvise(HUGEPAGE)")
        buf = (ctypes.c_char * self.nbytes).from_address(self.base)
        buf._owner = self  # type: ignore[attr-defined]  # any tensor over the buffer keeps the mapping alive
        self._buf = buf
        self._tensor = torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(self.shape)
        self.num_releases = 0

    def __del__(self) -> None:
        if getattr(self, "_map_addr", None):
            _libc.munmap(self._map_addr, self._map_len)
            self._map_addr = None

    def layer_views(self) -> list[torch.Tensor]:
        """Per layer [2, num_slots, slot_tokens, Hkv, D]: contiguous, the paged cache's shape and indexing."""
        return [self._tensor[i] for i in range(self.num_layers)]

    def range_addr(self, layer: int, kv: int, slot: int) -> int:
        """Address of one (layer, K or V, slot) range."""
        return self.base + ((layer * 2 + kv) * self.num_slots + slot) * self.range_bytes

    def release(self, slot: int, num_tokens: int, keep_tokens: int = 0) -> None:
        """Give back the pages of tokens [keep_tokens, num_tokens) of ``slot`` in every range (2 * num_layers
        ``madvise(MADV_DONTNEED)`` calls): the memory returns to the system at once, and the next write there
        faults in a fresh zero page."""
        first = keep_tokens * self.row_bytes // self.page_size * self.page_size
        if keep_tokens * self.row_bytes % self.page_size:
            first += self.page_size  # the page holding token keep_tokens - 1 stays
        end = min(pages_for(num_tokens, self.row_bytes, self.page_size) * self.page_size, self.range_bytes)
        if end <= first:
            return
        for layer in range(self.num_layers):
            for kv in (0, 1):
                _check(_libc.madvise(self.range_addr(layer, kv, slot) + first, end - first, _MADV_DONTNEED),
                       "madvise(DONTNEED)")
        self.num_releases += 1

    def check_step(self, seqs: Sequence[ScheduledSeq]) -> None:
        """The writer's guard, once per step: every sequence writes inside its own slot (one slot, positions below
        slot_tokens); a position past it would land in the next request's range."""
        for s in seqs:
            end = s.start_pos + len(s.token_ids) + s.num_draft_slots
            if len(s.block_ids) != 1 or not 0 <= s.block_ids[0] < self.num_slots or end > self.slot_tokens:
                raise InvalidParameterError(
                    f"kv_cache_layout virtual: request {s.request_id} would write K/V at positions "
                    f"{s.start_pos}..{end - 1} of slot {s.block_ids}, past its range of {self.slot_tokens} tokens "
                    f"(max_model_len) or outside the {self.num_slots} slots", "max_model_len")

    def committed_pages(self, slot: int) -> int:
        """Pages of ``slot``'s ranges (all layers, K and V) in physical memory now, counted with ``mincore`` in
        small pages: a slot is never charged for less than this, and no kernel wrote past what it was charged."""
        small = self.range_bytes // SMALL_PAGE
        vec = (ctypes.c_ubyte * small)()
        total = 0
        for layer in range(self.num_layers):
            for kv in (0, 1):
                _check(_libc.mincore(self.range_addr(layer, kv, slot), self.range_bytes, vec), "mincore")
                total += sum(b & 1 for b in vec)
        return total * SMALL_PAGE // self.page_size

    def resident(self) -> dict[str, int]:
        """Bytes of this reservation in physical memory now, from /proc/self/smaps: ``rss`` and, of it,
        ``anon_huge`` (in transparent huge pages)."""
        lo, hi = self.base, self.base + self.nbytes
        out = {"rss": 0, "anon_huge": 0}
        inside = False
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    start, stop = (int(x, 16) for x in head.split("-"))
                    inside = start < hi and stop > lo
                elif inside and head == "Rss:":
                    out["rss"] += int(line.split()[1]) * 1024
                elif inside and head == "AnonHugePages:":
                    out["anon_huge"] += int(line.split()[1]) * 1024
        return out


@dataclass(slots=True)
class _Slot:
    slot: int
    num_tokens: int = 0  # tokens the request may write (its reservation); pages are charged for these


@dataclass(slots=True)
class VirtualKVCacheManager:
    """``KVCacheManager``'s interface over slots and a page budget (see the module docstring).

    ``region`` (the runner's, same process) is told to release pages when a request frees them; without one (unit
    tests of the bookkeeping) only the accounting runs.
    """

    spec: VirtualKVSpec
    row_bytes: int  # one token's K (or V) in one layer
    num_ranges: int  # 2 * num_layers: ranges a request owns
    num_pages: int  # the budget
    region: VirtualKVRegion | None = None
    enable_caching: bool = False  # no prefix sharing in this layout (module docstring)
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    requests: dict[str, _Slot] = field(default_factory=dict)
    free_slots: list[int] = field(default_factory=list)
    used_pages: int = 0

    def __post_init__(self) -> None:
        self.free_slots = list(range(self.spec.num_slots - 1, -1, -1))  # pop() hands out slot 0 first

    @property
    def block_size(self) -> int:
        return self.spec.slot_tokens

    @property
    def num_blocks(self) -> int:
        return self.num_pages

    @property
    def num_free_blocks(self) -> int:
        return self.num_pages - self.used_pages

    def usage(self) -> float:
        """Fraction of the page budget held by live requests."""
        return self.used_pages / self.num_pages

    def pages(self, num_tokens: int) -> int:
        """Pages a request holding ``num_tokens`` tokens is charged (all its ranges)."""
        return self.num_ranges * pages_for(num_tokens, self.row_bytes, self.spec.page_size)

    def block_ids(self, request_id: str) -> list[int]:
        entry = self.requests.get(request_id)
        return [entry.slot] if entry else []

    def get_computed_blocks(self, request: Request) -> tuple[list, int]:
        return [], 0

    def record_lookup(self, num_queried: int, num_hit: int) -> None:
        self.stats.queries += num_queried  # hit rate 0: recorded so the two layouts report alike

    def can_allocate(self, request: Request, num_new_tokens: int, computed: list | None = None,
                     num_computed_tokens: int | None = None) -> bool:
        return self._short(request, num_new_tokens, num_computed_tokens) <= 0

    def allocate_slots(self, request: Request, num_new_tokens: int, computed: list | None = None,
                       num_computed_tokens: int | None = None) -> bool:
        """Reserve room for ``num_new_tokens`` more tokens (a slot on first call). False, changing nothing, when
        the page budget or the slots are short; an error past the slot's length (max_model_len)."""
        if computed:
            raise ValueError("kv_cache_layout virtual: no prefix sharing, computed blocks must be empty")
        if self._short(request, num_new_tokens, num_computed_tokens) > 0:
            return False
        entry = self.requests.get(request.request_id)
        if entry is None:
            if not self.free_slots:
                return False
            entry = self.requests[request.request_id] = _Slot(self.free_slots.pop())
        total = self._total(request, num_new_tokens, num_computed_tokens)
        if total > entry.num_tokens:
            self.used_pages += self.pages(total) - self.pages(entry.num_tokens)
            entry.num_tokens = total
        return True

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Give back the pages past the first ``num_tokens`` tokens (rejected draft tokens' room)."""
        entry = self.requests.get(request_id)
        if entry is None or entry.num_tokens <= num_tokens:
            return
        if self.region is not None:
            self.region.release(entry.slot, entry.num_tokens, keep_tokens=num_tokens)
        self.used_pages -= self.pages(entry.num_tokens) - self.pages(num_tokens)
        entry.num_tokens = num_tokens

    def free(self, request_id: str) -> None:
        """Return the request's pages to the system and its slot to the free list (finish, abort, preemption)."""
        entry = self.requests.pop(request_id, None)
        if entry is None:
            return
        if self.region is not None:
            self.region.release(entry.slot, entry.num_tokens)
        self.used_pages -= self.pages(entry.num_tokens)
        self.free_slots.append(entry.slot)

    def _total(self, request: Request, num_new_tokens: int, num_computed_tokens: int | None) -> int:
        base = request.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
        total = base + num_new_tokens
        if total > self.spec.slot_tokens:
            raise InvalidParameterError(
                f"kv_cache_layout virtual: request {request.request_id} needs {total} tokens of KV, past its "
                f"reserved range of {self.spec.slot_tokens} tokens (max_model_len)", "max_model_len")
        return total

    def _short(self, request: Request, num_new_tokens: int, num_computed_tokens: int | None) -> int:
        entry = self.requests.get(request.request_id)
        if entry is None and not self.free_slots:
            return 1
        have = entry.num_tokens if entry else 0
        need = self.pages(self._total(request, num_new_tokens, num_computed_tokens)) - self.pages(have)
        return need - self.num_free_blocks


def build_virtual_kv(executor: Any, num_blocks: int, block_size: int, max_num_seqs: int, max_model_len: int,
                     page_size: int = SMALL_PAGE) -> VirtualKVCacheManager:
    """The engine core's virtual layout: the paged pool's memory (``num_blocks`` blocks of ``block_size``) as a page
    budget, ``max_num_seqs`` slots of at least max_model_len tokens reserved by the executor's runner."""
    from cinq.step.shape_buckets import MAX_PAD_ROWS

    num_layers = executor.model_config.num_hidden_layers
    row_bytes = executor.kv_bytes_per_block(1) // (2 * num_layers)
    # the runner's scratch slot holds a step's padding rows too: at least MAX_PAD_ROWS tokens
    spec = VirtualKVSpec(max_num_seqs, slot_tokens_for(max(max_model_len, MAX_PAD_ROWS), row_bytes, page_size),
                         page_size)
    num_pages = num_blocks * executor.kv_bytes_per_block(block_size) // page_size
    manager = VirtualKVCacheManager(spec, row_bytes, 2 * num_layers, num_pages)
    if num_pages < manager.pages(1):
        raise InvalidParameterError(
            f"kv_cache_memory: {num_pages} pages of {page_size} B hold no token ({manager.pages(1)} pages each)",
            "kv_cache_memory")
    executor.initialize_cache(spec.num_slots, virtual=spec)
    manager.region = executor.runner.kv_region
    return manager
