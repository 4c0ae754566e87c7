"""Pack a served model's CPU weights into one buffer in 2 MB pages (host_memory.huge_page_tensor).

A decode step reads every weight once. Loaded tensor by tensor, they sit on the heap in 4 KB pages (glibc serves
everything from there once keep_freed_memory() ran), where the stream misses the TLB at every page. After loading,
each distinct storage is copied into the arena and every parameter and buffer that viewed it is pointed at its copy
(``tensor.data = ...``: the same Python objects, so modules, tied weights and anything holding them keep working);
the old storages are freed when nothing else holds them. Values, shapes, strides and dtypes are unchanged: a packed
model computes bit-identical outputs.

Only the engine packs (its executor, right after loading, before the fused decode program or a compile captures
any tensor); models built for training, export or evaluation keep ordinary tensors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from cinq.host_memory import huge_page_bytes, huge_page_tensor, huge_pages_available

log = logging.getLogger(__name__)
_ALIGN = 64  # every storage starts on a cache line, as the allocator's own tensors do
MIN_PACK_BYTES = 4 << 20  # below two huge pages there is nothing to gain


@dataclass(slots=True)
class PackedWeights:
    """What ``pack_weights`` did: the bytes copied, how many of them sit in huge pages now, the storages and
    tensors moved. ``arena`` is the buffer (held by the tensors' views too)."""

    nbytes: int
    huge_bytes: int
    storages: int
    tensors: int
    arena: torch.Tensor


def pack_weights(*modules: torch.nn.Module, min_bytes: int | None = None) -> PackedWeights | None:
    """Move every CPU parameter and buffer of ``modules`` (shared ones once) into one huge-page arena; None when
    huge pages are unavailable (or turned off: ``CINQ_HUGE_PAGES=0``), nothing is on the CPU, or the weights are
    under ``min_bytes`` (default MIN_PACK_BYTES)."""
    if not huge_pages_available():
        return None
    tensors: dict[int, torch.Tensor] = {}
    for module in modules:
        for sub in module.modules():
            for t in (*sub._parameters.values(), *sub._buffers.values()):
                if t is not None and t.device.type == "cpu" and not t.is_meta and t.layout == torch.strided:
                    tensors[id(t)] = t
    storages: dict[int, torch.UntypedStorage] = {}
    for t in tensors.values():
        s = t.untyped_storage()
        if s.nbytes():
            storages.setdefault(s.data_ptr(), s)
    total = sum(_aligned(s.nbytes()) for s in storages.values())
    if total < max(MIN_PACK_BYTES if min_bytes is None else min_bytes, 1):
        return None
    arena = huge_page_tensor(total)
    offsets: dict[int, int] = {}
    at = 0
    for ptr, s in storages.items():
        n = s.nbytes()
        arena[at:at + n].copy_(torch.empty(0, dtype=torch.uint8).set_(s))
        offsets[ptr] = at
        at += _aligned(n)
    moved = 0
    with torch.no_grad():
        for t in tensors.values():
            s = t.untyped_storage()
            if s.data_ptr() not in offsets:
                continue
            at = offsets[s.data_ptr()]
            base = arena[at:at + s.nbytes() // t.element_size() * t.element_size()].view(t.dtype)
            t.data = base.as_strided(t.shape, t.stride(), base.storage_offset() + t.storage_offset())
            moved += 1
    packed = PackedWeights(total, huge_page_bytes(arena), len(storages), moved, arena)
    log.info("weights: %.1f MB packed into one arena, %.1f MB of it in 2 MB pages (%d tensors)",
             total / 1e6, packed.huge_bytes / 1e6, moved)
    return packed


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN
