"""Paged KV cache bookkeeping (no tensors here: the runner owns those).

``BlockPool`` hands out fixed-size blocks, reference-counted so requests can share them, and keeps freed blocks
that still hold a cached prefix in an LRU free list: they are reusable by a later prompt with the same prefix until
the pool needs the space. ``KVCacheManager`` does the per-request part: block tables, prefix-cache lookups, and
registering blocks as they fill.

A block's hash is ``hash((parent_hash, token ids of the block))``, so equal hashes mean equal whole prefixes; hits
are still verified against the stored token ids. Only full blocks are ever cached or shared.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from cinq.step.request import Request


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None  # set once the block is full and registered in the prefix cache
    token_ids: tuple[int, ...] | None = None  # the tokens whose K/V it holds, to verify hash hits


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Chained block hash: equal hashes imply equal prefixes up to and including this block (modulo collisions,
    which the token-id check on lookup catches)."""
    return hash((parent_hash, token_ids))


class BlockPool:
    """All KV blocks, their reference counts, the LRU free list and the hash -> block prefix cache."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # Least recently freed first. An OrderedDict gives O(1) removal when a free cached block is hit again.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        """Fraction of blocks held by live requests (free cached blocks count as free)."""
        return 1.0 - len(self.free) / self.num_blocks

    def allocate(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` free blocks (evicting the least recently freed cached prefixes). Caller checks capacity."""
        out = []
        for _ in range(n):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                if self.cached.get(block.block_hash) is block:
                    del self.cached[block.block_hash]
                block.block_hash = None
                block.token_ids = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Add a reference to each block (a prefix-cache hit), taking free ones off the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free[block.block_id]
            block.ref_cnt += 1

    def release(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the order given (earlier ones get evicted first)."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free[block.block_id] = None

    def lookup(self, block_hash: int, token_ids: tuple[int, ...]) -> KVCacheBlock | None:
        block = self.cached.get(block_hash)
        if block is None or block.token_ids != token_ids:
            return None
        return block

    def register(self, block: KVCacheBlock, block_hash: int, token_ids: tuple[int, ...]) -> None:
        """Record a now-full block in the prefix cache (the first block with a given content wins)."""
        block.block_hash = block_hash
        block.token_ids = token_ids
        self.cached.setdefault(block_hash, block)


@dataclass(slots=True)
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of which served from the cache


@dataclass(slots=True)
class _RequestBlocks:
    blocks: list[KVCacheBlock] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # hashes of the request's full blocks, in order
    num_registered: int = 0  # leading blocks already registered in the prefix cache


class KVCacheManager:
    """Per-request block tables over a shared BlockPool, with prefix caching."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.requests: dict[str, _RequestBlocks] = {}
        self.stats = PrefixCacheStats()

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def block_ids(self, request_id: str) -> list[int]:
        entry = self.requests.get(request_id)
        return [b.block_id for b in entry.blocks] if entry else []

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of the request's known tokens, as (blocks, number of tokens they cover).

        Never the whole sequence: its last token is always recomputed so there are logits to sample from.
        """
        if not self.enable_caching:
            return [], 0
        entry = self.requests.setdefault(request.request_id, _RequestBlocks())
        tokens = request.all_token_ids
        self._extend_hashes(entry, tokens, len(tokens))
        max_blocks = (len(tokens) - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        bs = self.block_size
        for i in range(max_blocks):
            block = self.pool.lookup(entry.hashes[i], tuple(tokens[i * bs:(i + 1) * bs]))
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * bs

    def record_lookup(self, num_queried: int, num_hit: int) -> None:
        """Count a lookup whose request was admitted (a request that keeps waiting is counted once)."""
        if self.enable_caching:
            self.stats.queries += num_queried
            self.stats.hits += num_hit

    def can_allocate(self, request: Request, num_new_tokens: int, computed: list[KVCacheBlock] | None = None,
                     num_computed_tokens: int | None = None) -> bool:
        return self._blocks_short(request, num_new_tokens, computed or [], num_computed_tokens) <= 0

    def allocate_slots(self, request: Request, num_new_tokens: int, computed: list[KVCacheBlock] | None = None,
                       num_computed_tokens: int | None = None) -> bool:
        """Give the request room for ``num_new_tokens`` more tokens (after adopting the prefix-cache hits
        ``computed``); register blocks that become full. Returns False, changing nothing, if the pool is short."""
        computed = computed or []
        if self._blocks_short(request, num_new_tokens, computed, num_computed_tokens) > 0:
            return False
        entry = self.requests.setdefault(request.request_id, _RequestBlocks())
        base = request.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
        total = base + num_new_tokens
        if computed:
            self.pool.touch(computed)
            entry.blocks.extend(computed)
            entry.num_registered = len(entry.blocks)  # hits are registered already
        need = -(-total // self.block_size) - len(entry.blocks)
        if need > 0:
            entry.blocks.extend(self.pool.allocate(need))
        if self.enable_caching:
            self._register_full_blocks(entry, request, total)
        return True

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Return the blocks past the first ``num_tokens`` slots (the room of rejected draft tokens). They hold
        nothing registered: only full blocks of verified tokens are ever hashed."""
        entry = self.requests.get(request_id)
        keep = -(-num_tokens // self.block_size)
        if entry is not None and len(entry.blocks) > keep:
            extra = entry.blocks[keep:]
            del entry.blocks[keep:]
            self.pool.release(list(reversed(extra)))

    def free(self, request_id: str) -> None:
        """Release a request's blocks (finish, abort, preemption). Tail blocks are evicted first."""
        entry = self.requests.pop(request_id, None)
        if entry is not None:
            self.pool.release(list(reversed(entry.blocks)))

    def _blocks_short(self, request: Request, num_new_tokens: int, computed: list[KVCacheBlock],
                      num_computed_tokens: int | None) -> int:
        entry = self.requests.get(request.request_id)
        have = len(entry.blocks) if entry else 0
        base = request.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
        need = -(-(base + num_new_tokens) // self.block_size) - have - len(computed)
        # Hits sitting in the free list stop being free once adopted.
        reclaimed = sum(1 for b in computed if b.ref_cnt == 0)
        return need - (self.pool.num_free_blocks - reclaimed)

    def _extend_hashes(self, entry: _RequestBlocks, tokens: list[int], upto: int) -> None:
        bs = self.block_size
        for i in range(len(entry.hashes), upto // bs):
            parent = entry.hashes[i - 1] if i else None
            entry.hashes.append(hash_block(parent, tuple(tokens[i * bs:(i + 1) * bs])))

    def _register_full_blocks(self, entry: _RequestBlocks, request: Request, num_tokens: int) -> None:
        # Blocks are registered when scheduled, not when computed: their K/V is written in this same step, and
        # every layer stores the whole batch's K/V before attending, so a same-step hit reads valid data.
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        if num_full <= entry.num_registered:
            return
        tokens = request.all_token_ids
        self._extend_hashes(entry, tokens, num_full * self.block_size)
        bs = self.block_size
        for i in range(entry.num_registered, num_full):
            self.pool.register(entry.blocks[i], entry.hashes[i], tuple(tokens[i * bs:(i + 1) * bs]))
        entry.num_registered = num_full
