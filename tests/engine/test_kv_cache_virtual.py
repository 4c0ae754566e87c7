"""The virtual-contiguous KV layout: the reservation (commit on write, release to the system), the page-budget
manager, the writer's guard, and the engine serving the same greedy tokens as the paged layout."""

from __future__ import annotations

import random

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.config import EngineConfig
from cinq.engine.kv_cache_virtual import (SMALL_PAGE, VirtualKVCacheManager, VirtualKVRegion, VirtualKVSpec,
                                          pages_for, slot_tokens_for)
from cinq.errors import InvalidParameterError
from cinq.step.request import Request
from cinq.step.scheduler_output import ScheduledSeq

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def req(rid: str, n: int) -> Request:
    return Request(rid, list(range(3, 3 + n)), SamplingParams(), max_tokens=8, arrival_time=0.0)


def test_slot_tokens_make_whole_pages() -> None:
    assert slot_tokens_for(2048, 384, SMALL_PAGE) == 2048  # 32 tokens of 384 B are 3 pages
    assert slot_tokens_for(2050, 384, SMALL_PAGE) == 2080
    assert slot_tokens_for(100, 384, 2 << 20) == 16384  # a 2 MiB page holds 5461.3 tokens: 3 pages per 16384
    assert pages_for(11, 384, SMALL_PAGE) == 2 and pages_for(10, 384, SMALL_PAGE) == 1


def test_reservation_commits_on_write_and_release_returns_the_memory() -> None:
    # 4 layers x 2 x 8 slots x 4096 tokens x 512 B = 128 MiB of address space
    region = VirtualKVRegion(4, 8, 4096, 4, 32, torch.float32)
    assert region.resident()["rss"] == 0  # reserved, nothing committed
    caches = region.layer_views()
    for cache in caches:
        cache[:, 3, :100] = 1.0  # slot 3, 100 tokens x 512 B = 12.5 pages per range
    committed = 4 * 2 * pages_for(100, 512, SMALL_PAGE) * SMALL_PAGE
    assert region.resident()["rss"] == committed
    region.release(3, 100, keep_tokens=40)  # trim: tokens 40.. go back, the page holding token 39 stays
    assert region.resident()["rss"] == 4 * 2 * pages_for(40, 512, SMALL_PAGE) * SMALL_PAGE
    assert float(caches[2][0, 3, 39].sum()) == 128.0 and float(caches[2][0, 3, 60].sum()) == 0.0
    region.release(3, 100)
    assert region.resident()["rss"] == 0
    assert float(caches[0][1, 3, :100].abs().sum()) == 0.0  # reads of released pages see fresh zero pages


def test_manager_charges_pages_and_refuses_when_short() -> None:
    spec = VirtualKVSpec(num_slots=3, slot_tokens=512, page_size=SMALL_PAGE)
    kv = VirtualKVCacheManager(spec, row_bytes=128, num_ranges=4, num_pages=24)  # 32 tokens per page
    a, b = req("a", 40), req("b", 70)
    assert kv.allocate_slots(a, 40) and kv.num_free_blocks == 24 - 4 * 2
    assert kv.allocate_slots(b, 70) and kv.num_free_blocks == 24 - 8 - 4 * 3
    assert kv.block_ids("a") == [0] and kv.block_ids("b") == [1]
    c = req("c", 33)
    assert not kv.can_allocate(c, 33) and not kv.allocate_slots(c, 33)  # 8 pages needed, 4 free
    assert kv.block_ids("c") == [] and kv.num_free_blocks == 4
    kv.free("a")
    assert kv.allocate_slots(c, 33) and kv.block_ids("c") == [0]  # a's slot, reused
    kv.trim("c", 10)
    assert kv.num_free_blocks == 24 - 12 - 4
    kv.free("b")
    kv.free("c")
    assert kv.num_free_blocks == 24 and kv.usage() == 0.0 and sorted(kv.free_slots) == [0, 1, 2]


def test_past_max_model_len_is_a_clear_error() -> None:
    spec = VirtualKVSpec(num_slots=2, slot_tokens=64, page_size=SMALL_PAGE)
    kv = VirtualKVCacheManager(spec, row_bytes=128, num_ranges=2, num_pages=100)
    r = req("a", 60)
    assert kv.allocate_slots(r, 60)
    r.num_computed_tokens = 60
    with pytest.raises(InvalidParameterError, match="needs 65 tokens of KV, past its reserved range of 64"):
        kv.allocate_slots(r, 5)
    region = VirtualKVRegion(1, 2, 64, 2, 16, torch.float32)
    region.check_step([ScheduledSeq("a", [1] * 4, 60, [1], 1)])  # positions 60..63: inside
    with pytest.raises(InvalidParameterError, match="positions 61..64 of slot \\[1\\], past its range of 64"):
        region.check_step([ScheduledSeq("a", [1] * 4, 61, [1], 1)])


def test_layout_flag_is_validated() -> None:
    assert EngineConfig(kv_cache_layout="virtual").kv_cache_layout == "virtual"
    with pytest.raises(InvalidParameterError, match="kv_cache_layout must be one of"):
        EngineConfig(kv_cache_layout="contig")
    with pytest.raises(InvalidParameterError, match="does not support attention_backend 'sdpa'"):
        EngineConfig(kv_cache_layout="virtual", attention_backend="sdpa")
    with pytest.raises(InvalidParameterError, match="does not support compilation_config"):
        EngineConfig(kv_cache_layout="virtual", compilation_config={"mode": 3})
    with pytest.raises(InvalidParameterError, match="use it with kv_cache_layout 'virtual'"):
        EngineConfig(attention_backend="contiguous")


def test_layout_flag_on_the_command_line() -> None:
    import argparse

    from cinq.commands.engine_args import add_engine_args, engine_config_from_args
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args(["--kv-cache-layout", "virtual"])).kv_cache_layout == "virtual"
    assert engine_config_from_args(parser.parse_args([])).kv_cache_layout == "paged"


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 250) for _ in range(40)]  # half the prompts share a 40-token prefix
    return [(shared if i % 2 else []) + [rng.randrange(3, 250) for _ in range(rng.randint(1, 50))]
            for i in range(n)]


def test_same_greedy_tokens_as_paged_with_preemptions_and_memory_returned(tiny_llama) -> None:
    ps = prompts(10)
    paged = LLM(tiny_llama, dtype="float32", block_size=4, num_kv_blocks=400)
    ref = [o.outputs[0].token_ids for o in paged.generate(ps, GREEDY)]
    again = [o.outputs[0].token_ids for o in paged.generate(ps, GREEDY)]  # served from the prefix cache
    assert again == ref and paged.engine.get_stats().prefix_cache_hits > 0
    # 32 blocks of 4 tokens: 16 pages of 4 KiB, 4 per range; the longest request needs them all
    virtual = LLM(tiny_llama, dtype="float32", block_size=4, num_kv_blocks=32, max_num_batched_tokens=64,
                  kv_cache_layout="virtual")
    engine = virtual.engine
    engine.add_request("live", ps[0], GREEDY)
    engine.step()
    live = engine.get_stats()  # stats mid-run count the slot's reservation as held
    assert live.kv_tokens_held == len(ps[0]) and live.kv_slots_held == len(ps[0])
    while engine.has_unfinished_requests():
        engine.step()
    # no access past a request's charged pages: after every step each live slot has exactly those pages committed
    kv, region = engine.kv, engine.kv.region
    for i, p in enumerate(ps[:4]):
        engine.add_request(f"w{i}", p, GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
        for entry in kv.requests.values():
            assert region.committed_pages(entry.slot) == kv.pages(entry.num_tokens)
    outs = virtual.generate(ps, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == ref
    stats = virtual.engine.get_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits == 0
    assert kv.used_pages == 0 and kv.num_free_blocks == 16
    # every request's pages went back to the system; what stays is the padding rows' scratch slot (<= 128 tokens)
    assert region.num_releases >= len(ps)
    pad_bound = 2 * 2 * pages_for(128, region.row_bytes, SMALL_PAGE) * SMALL_PAGE
    assert region.resident()["rss"] <= pad_bound
