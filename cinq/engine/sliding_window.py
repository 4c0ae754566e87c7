"""Sliding-window KV freeing (vLLM's SlidingWindowManager, for models whose every layer is windowed).

A query at position p of a sliding-window layer reads keys at positions > p - W only. When a request's next step
starts at position s, no query of it (nor of any later step) reads keys at positions <= s - W, so a block whose
last position is <= s - W is dead: ``SlidingWindowKVCacheManager`` returns it to the pool before allocating the
step's new blocks, and puts a shared *null block* in its place in the block table (positions keep their index:
the table is indexed by position // block_size; the kernels skip or mask what lies before the window, and the
null block holds finite values for those that gather it).

Why only when every layer is windowed: cinq's block table is shared by all layers (block id b holds the K/V of
every layer for its positions). In a model that interleaves local and global layers (Gemma 3: 15 local, 3 global
of 18), the global layers still read every position, so no block can go back without per-layer-group tables
(vLLM's hybrid allocator: one table per group), which ``kv_cache_groups.py`` provides, using this manager for its
sliding group. ``kv_memory_per_context`` gives the arithmetic of both layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from cinq.engine.kv_cache import KVCacheBlock, KVCacheManager
from cinq.model.config import ModelConfig
from cinq.step.request import Request


class SlidingWindowKVCacheManager(KVCacheManager):
    """``KVCacheManager`` that frees blocks out of every layer's window (all layers sliding, window ``window``).

    One block of the pool is the null block (never handed out, never freed)."""

    def __init__(self, num_blocks: int, block_size: int, window: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"sliding-window KV needs at least 2 blocks (one is the null block), got {num_blocks}")
        super().__init__(num_blocks, block_size, enable_caching)
        self.window = window
        self.null_block: KVCacheBlock = self.pool.allocate(1)[0]
        self.num_freed_blocks = 0  # blocks returned out of window so far (stats, tests)

    def first_live_block(self, start: int) -> int:
        """Index of the first block a step starting at position ``start`` (or any later one) still reads."""
        return max(0, start - self.window + 1) // self.block_size

    def free_out_of_window(self, request: Request, start: int | None = None) -> int:
        """Return the request's blocks before ``first_live_block(start)`` (default: its next position) to the
        pool; returns how many were freed."""
        entry = self.requests.get(request.request_id)
        if entry is None:
            return 0
        start = request.num_computed_tokens if start is None else start
        dead = [i for i in range(min(self.first_live_block(start), len(entry.blocks)))
                if entry.blocks[i] is not self.null_block]
        if dead:
            self.pool.release([entry.blocks[i] for i in dead])
            for i in dead:
                entry.blocks[i] = self.null_block
            self.num_freed_blocks += len(dead)
        return len(dead)

    def allocate_slots(self, request: Request, num_new_tokens: int, computed: list[KVCacheBlock] | None = None,
                       num_computed_tokens: int | None = None) -> bool:
        if not computed:  # a running request (hits come only at admission, before any block is dead)
            self.free_out_of_window(request)
        return super().allocate_slots(request, num_new_tokens, computed, num_computed_tokens)

    def trim(self, request_id: str, num_tokens: int) -> None:
        entry = self.requests.get(request_id)
        keep = -(-num_tokens // self.block_size)
        if entry is not None and len(entry.blocks) > keep:
            extra = [b for b in entry.blocks[keep:] if b is not self.null_block]
            del entry.blocks[keep:]
            self.pool.release(list(reversed(extra)))

    def free(self, request_id: str) -> None:
        entry = self.requests.pop(request_id, None)
        if entry is not None:
            self.pool.release([b for b in reversed(entry.blocks) if b is not self.null_block])


def make_kv_cache_manager(config: ModelConfig, num_blocks: int, block_size: int,
                          enable_caching: bool) -> KVCacheManager:
    """The sliding-window manager when every layer of the model is windowed, else the plain one."""
    types = config.layer_types
    if types and all(t == "sliding_attention" for t in types) and config.sliding_window and num_blocks >= 2:
        return SlidingWindowKVCacheManager(num_blocks, block_size, config.sliding_window, enable_caching)
    return KVCacheManager(num_blocks, block_size, enable_caching)


@dataclass(slots=True, frozen=True)
class KVMemory:
    """KV bytes one request of ``context`` tokens holds, per layout."""

    context: int
    shared_table: int  # one table for all layers (cinq today): every layer keeps every position
    per_group_tables: int  # local layers keep only their window (+ one partial block), global layers all


def kv_memory_per_context(context: int, layer_windows: list[int | None], kv_heads: int, head_dim: int,
                          dtype_bytes: int, block_size: int) -> KVMemory:
    """Arithmetic of a request's KV at ``context`` tokens, in whole blocks, for the two layouts."""
    per_layer_token = 2 * kv_heads * head_dim * dtype_bytes
    blocks = -(-context // block_size)
    shared = len(layer_windows) * blocks * block_size * per_layer_token
    grouped = 0
    for window in layer_windows:
        live = blocks if window is None else min(blocks, -(-window // block_size) + 1)
        grouped += live * block_size * per_layer_token
    if all(w is not None for w in layer_windows):  # all local: the shared table frees too
        shared = grouped
    return KVMemory(context, shared, grouped)
