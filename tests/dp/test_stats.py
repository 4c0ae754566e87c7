"""Replica stats added up into one EngineStats, and a dead replica's counters kept without its gauges."""

from __future__ import annotations

from cinq.dp.stats import sum_stats, without_gauges
from cinq.outputs import EngineStats, SpecDecodingStats


def test_counters_add_and_kv_usage_is_over_all_blocks() -> None:
    a = EngineStats(num_running=2, num_waiting=1, kv_cache_usage=0.5, num_kv_blocks=100, prefix_cache_queries=40,
                    prefix_cache_hits=30, generation_tokens=7, finished_by_reason={"stop": 2},
                    spec_decode_num_accepted_tokens_per_pos=[3, 1],
                    spec_decode_by_language={"de": SpecDecodingStats(2, 6, 3)})
    b = EngineStats(num_running=1, kv_cache_usage=0.25, num_kv_blocks=300, prefix_cache_queries=10,
                    prefix_cache_hits=0, generation_tokens=5, finished_by_reason={"stop": 1, "length": 4},
                    spec_decode_num_accepted_tokens_per_pos=[1, 1, 1],
                    spec_decode_by_language={"de": SpecDecodingStats(1, 3, 1), "fr": SpecDecodingStats(1, 2, 2)})
    total = sum_stats([a, b])
    assert (total.num_running, total.num_waiting, total.num_kv_blocks) == (3, 1, 400)
    assert total.kv_cache_usage == (50 + 75) / 400
    assert (total.prefix_cache_queries, total.prefix_cache_hits, total.generation_tokens) == (50, 30, 12)
    assert total.prefix_cache_hit_rate == 30 / 50
    assert total.finished_by_reason == {"stop": 3, "length": 4}
    assert total.spec_decode_num_accepted_tokens_per_pos == [4, 2, 1]
    de, fr = total.spec_decode_by_language["de"], total.spec_decode_by_language["fr"]
    assert (de.num_drafts, de.num_draft_tokens, de.num_accepted_tokens) == (3, 9, 4)
    assert (fr.num_drafts, fr.num_accepted_tokens) == (1, 2)
    assert a.finished_by_reason == {"stop": 2} and a.spec_decode_by_language["de"].num_drafts == 2  # inputs intact


def test_a_dead_replica_keeps_its_counters_not_its_gauges() -> None:
    s = EngineStats(num_running=3, num_waiting=2, kv_cache_usage=0.9, num_kv_blocks=64, prompt_tokens=100)
    kept = without_gauges(s)
    assert (kept.num_running, kept.num_waiting, kept.kv_cache_usage, kept.num_kv_blocks) == (0, 0, 0.0, 0)
    assert kept.prompt_tokens == 100
    assert sum_stats([kept, EngineStats()]).kv_cache_usage == 0.0
