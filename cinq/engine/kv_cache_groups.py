"""KV cache groups (vLLM's hybrid KV cache manager) for models that interleave full and sliding-window layers.

cinq's plain layout has one block table shared by every layer, so a block holds the K/V of all layers for its
positions and can only be freed when no layer reads it: with Gemma 3's 3 global layers of 18, never. Here the layers
are split into two groups, each with its own block pool, block tables and KV tensors:

* group 0, the full-attention layers: the plain ``KVCacheManager`` (every position kept);
* group 1, the sliding-window layers: ``SlidingWindowKVCacheManager``, which returns blocks wholly out of the window
  to its pool (null block in their table entries).

``HybridKVCacheManager`` presents the scheduler the single-group interface (allocate / free / trim, all-or-nothing
across groups) and ``group_block_ids`` gives the runner one table per group; the runner puts the sliding group's
tables and slots in ``AttentionMetadata.group_block_tables`` / ``group_slot_mapping`` and each attention layer reads
its group's (``Attention.kv_group``, set from the layer's window).

Prefix caching is off with groups: a prefix hit must be a hit in every group (vLLM's rule), and the sliding group
has freed its early blocks by the time another request could reuse them; doing it right (hits on the window only)
is left for later. Models with a single layer type never come here: their path is unchanged.
"""

from __future__ import annotations

import dataclasses
import logging

import torch


from cinq.engine.kv_cache import KVCacheBlock, KVCacheManager, PrefixCacheStats
from cinq.engine.sliding_window import SlidingWindowKVCacheManager
from cinq.host_memory import kv_cache_tensor
from cinq.model.config import ModelConfig
from cinq.step.batch_inputs import PAD_ID, BatchInputs, prepare_inputs
from cinq.step.request import Request
from cinq.step.scheduler_output import ScheduledSeq

log = logging.getLogger(__name__)

FULL, SLIDING = 0, 1  # group indices: the full-attention layers' table is also the scheduler's ``block_ids``


def uses_kv_cache_groups(config: ModelConfig) -> bool:
    """True when the model mixes full and sliding-window layers (Gemma 3): it then takes the two-group path."""
    types = config.layer_types
    return bool(types and config.sliding_window and "sliding_attention" in types and "full_attention" in types)


def split_kv_blocks(config: ModelConfig, num_blocks: int, block_size: int, max_model_len: int,
                    max_num_batched_tokens: int) -> tuple[int, int]:
    """Blocks of the (full, sliding) groups for the byte budget of ``num_blocks`` shared blocks (all layers).

    The budget is split in proportion to what one request needs in each group at ``max_model_len``: every
    position in the full group; in the sliding group the window plus the largest step (a prefill chunk of
    ``max_num_batched_tokens``) plus two partial blocks. vLLM gives every group the same number of blocks instead,
    which suits its equal-size groups; Gemma 3 has 15 sliding and 3 full layers, and equal counts would leave the
    full group (the one that grows with the context) with a fifth of the bytes the split below gives it. A block
    of one layer costs the same in either group (same KV heads and head dim), so bytes are counted in layer-blocks.
    """
    types = config.layer_types or []
    n_full, n_sliding = types.count("full_attention"), types.count("sliding_attention")
    need_full = -(-max_model_len // block_size)
    window = config.sliding_window or max_model_len
    need_sliding = min(need_full, -(-(window - 1 + max_num_batched_tokens) // block_size) + 2)
    layer_blocks = num_blocks * len(types)
    full = layer_blocks * need_full // (n_full * need_full + n_sliding * need_sliding)
    sliding = (layer_blocks - full * n_full) // n_sliding
    if sliding < need_sliding + 1:  # the sliding group fits one request's largest step (+ its null block)
        sliding = need_sliding + 1
        full = (layer_blocks - sliding * n_sliding) // n_full
    return max(1, full), max(2, sliding)


class HybridKVCacheManager:
    """Two KV cache groups behind the single-group manager's interface (what ``Scheduler`` and the core call)."""

    def __init__(self, num_full_blocks: int, num_sliding_blocks: int, block_size: int, window: int) -> None:
        self.block_size = block_size
        self.enable_caching = False
        self.full = KVCacheManager(num_full_blocks, block_size, enable_caching=False)
        self.sliding = SlidingWindowKVCacheManager(num_sliding_blocks, block_size, window, enable_caching=False)
        self.groups: tuple[KVCacheManager, KVCacheManager] = (self.full, self.sliding)
        self.stats = PrefixCacheStats()  # stays zero: no prefix caching with groups

    @property
    def num_blocks(self) -> int:
        return self.full.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Free blocks of the full group (the one that grows with the context)."""
        return self.full.num_free_blocks

    @property
    def requests(self) -> dict:
        """Per-request entries of the full group (it holds every position: the core's held-slots statistics)."""
        return self.full.requests

    def usage(self) -> float:
        """The fuller group's usage: the one that runs out first decides preemption."""
        return max(self.full.usage(), self.sliding.usage())

    def block_ids(self, request_id: str) -> list[int]:
        return self.full.block_ids(request_id)

    def group_block_ids(self, request_id: str) -> list[list[int]]:
        """The request's block table in each group (indexed by ``FULL`` / ``SLIDING``)."""
        return [g.block_ids(request_id) for g in self.groups]

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        return [], 0

    def record_lookup(self, num_queried: int, num_hit: int) -> None:
        pass

    def can_allocate(self, request: Request, num_new_tokens: int, computed: list[KVCacheBlock] | None = None,
                     num_computed_tokens: int | None = None) -> bool:
        return all(g.can_allocate(request, num_new_tokens, None, num_computed_tokens) for g in self.groups)

    def allocate_slots(self, request: Request, num_new_tokens: int, computed: list[KVCacheBlock] | None = None,
                       num_computed_tokens: int | None = None) -> bool:
        """Room for ``num_new_tokens`` in both groups, or in neither (returns False, nothing allocated)."""
        if num_computed_tokens is None:  # a running request: its dead window blocks go back first
            self.sliding.free_out_of_window(request)
        if not self.can_allocate(request, num_new_tokens, None, num_computed_tokens):
            return False
        for g in self.groups:
            # the sliding manager's own out-of-window pass is a no-op now (already done above)
            ok = KVCacheManager.allocate_slots(g, request, num_new_tokens, None, num_computed_tokens)
            assert ok, "checked above"
        return True

    def trim(self, request_id: str, num_tokens: int) -> None:
        for g in self.groups:
            g.trim(request_id, num_tokens)

    def free(self, request_id: str) -> None:
        for g in self.groups:
            g.free(request_id)


def make_hybrid_kv_cache_manager(config: ModelConfig, group_blocks: tuple[int, int], block_size: int,
                                 enable_caching: bool) -> HybridKVCacheManager:
    """The two-group manager; says why prefix caching is off when it was asked for."""
    if enable_caching:
        log.info("prefix caching is off for %s: its full and sliding-window layers keep separate KV cache groups, "
                 "and a prefix hit would have to hit in both (the sliding group frees its early blocks)",
                 config.architecture)
    return HybridKVCacheManager(group_blocks[FULL], group_blocks[SLIDING], block_size, config.sliding_window)


def allocate_group_caches(attention_layers: list, group_blocks: tuple[int, int], num_pad_blocks: int,
                          block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                          device: torch.device) -> list[torch.Tensor]:
    """One KV tensor per layer, sized by its group's pool (+ the runner's scratch blocks); binds each layer's
    ``kv_group`` from its window. Returns the tensors in layer order."""
    caches = []
    for attn in attention_layers:
        group = SLIDING if attn.sliding_window is not None else FULL
        attn.kv_group = group
        caches.append(kv_cache_tensor((2, group_blocks[group] + num_pad_blocks, block_size, num_kv_heads, head_dim),
                                      dtype, device))
    return caches


def add_group_tables(batch: BatchInputs, group_pad_block_ids: list[list[int]], block_size: int,
                     device: torch.device) -> None:
    """Put every group's block tables and slots of ``batch`` in its metadata (group 0's are the batch's own).

    The rows are the batch's: its sequences in order, then the bucket's padding sequence (if any) on the group's
    own scratch blocks ``group_pad_block_ids[g]``."""
    meta = batch.meta
    tables, slots = [meta.block_tables], [meta.slot_mapping]
    num_pad = meta.num_tokens - batch.starts[-1]
    for g in range(1, len(group_pad_block_ids)):
        seqs = [dataclasses.replace(s, block_ids=s.group_block_ids[g]) for s in batch.seqs]
        if num_pad:
            seqs.append(ScheduledSeq(PAD_ID, [0] * num_pad, 0, group_pad_block_ids[g], 0))
        group_meta, _, _ = prepare_inputs(seqs, meta.decode_query_len, block_size, device)
        tables.append(group_meta.block_tables)
        slots.append(group_meta.slot_mapping)
    meta.group_block_tables, meta.group_slot_mapping = tables, slots
