"""BlockPool / KVCacheManager: allocation, sharing, LRU reuse of freed cached blocks, verification of hits."""

from __future__ import annotations

from cinq.engine.kv_cache import KVCacheManager
from cinq.sampling_params import SamplingParams
from cinq.step.request import Request


def req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), max_tokens=8, arrival_time=0.0)


def admit(kv: KVCacheManager, r: Request) -> int:
    hits, n = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - n, hits, n)
    kv.record_lookup(r.num_tokens, n)
    r.num_computed_tokens = r.num_tokens
    return n


def test_allocates_on_demand_and_frees_everything():
    kv = KVCacheManager(num_blocks=10, block_size=4, enable_caching=False)
    r = req("a", list(range(6)))
    assert admit(kv, r) == 0
    assert len(kv.block_ids("a")) == 2
    for t in range(3):  # tokens 7..9 fit in block 2 once it is allocated
        r.append_output_token(100 + t)
        assert kv.allocate_slots(r, 1)
        r.num_computed_tokens += 1
    assert len(kv.block_ids("a")) == 3
    kv.free("a")
    assert kv.num_free_blocks == 10


def test_refuses_when_short_and_changes_nothing():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    r = req("a", list(range(12)))
    assert not kv.allocate_slots(r, 12)
    assert kv.num_free_blocks == 2 and kv.block_ids("a") == []


def test_identical_prompt_hits_all_full_blocks_but_the_last_token():
    kv = KVCacheManager(num_blocks=20, block_size=4)
    prompt = list(range(12))  # exactly 3 full blocks
    admit(kv, req("a", prompt))
    b = req("b", prompt)
    n = admit(kv, b)
    assert n == 8  # the last block is recomputed so the last token has logits
    assert kv.block_ids("a")[:2] == kv.block_ids("b")[:2]
    assert kv.block_ids("a")[2] != kv.block_ids("b")[2]
    assert kv.stats.queries == 24 and kv.stats.hits == 8


def test_freed_blocks_stay_cached_until_evicted_lru():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    admit(kv, req("a", list(range(9))))  # 3 blocks, 2 full and cached
    kv.free("a")
    assert kv.num_free_blocks == 4
    assert admit(kv, req("b", list(range(9)))) == 8  # still cached after free
    kv.free("b")
    admit(kv, req("c", [50 + i for i in range(16)]))  # needs all 4 blocks: evicts the cached prefix
    kv.free("c")
    assert admit(kv, req("d", list(range(9)))) == 0


def test_hash_hit_is_verified_against_token_ids():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    admit(kv, req("a", list(range(9))))
    # Forge a collision: same hash chain, different tokens stored in the block.
    block = kv.pool.cached[next(iter(kv.pool.cached))]
    block.token_ids = (99, 99, 99, 99)
    assert admit(kv, req("b", list(range(9)))) == 0


def test_shared_blocks_are_reference_counted():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    prompt = list(range(9))
    admit(kv, req("a", prompt))
    admit(kv, req("b", prompt))
    shared = kv.block_ids("a")[0]
    assert kv.pool.blocks[shared].ref_cnt == 2
    kv.free("a")
    assert kv.pool.blocks[shared].ref_cnt == 1
    kv.free("b")
    assert kv.num_free_blocks == 6
