"""The prefix-caching benchmark: caching off never hits and computes every prompt token; caching on hits the
shared prefix and computes fewer; the sweep shrinks the KV budget and its hit rate cannot rise."""

from __future__ import annotations

from cinq.bench.prefix import PrefixOptions, run_prefix
from cinq.bench.prefix_workload import PrefixWorkloadOptions
from cinq.config import EngineConfig


def test_caching_on_hits_the_shared_prefix_and_off_never_does(tiny_llama):
    work = PrefixWorkloadOptions(prefix_len=64, num_requests=4, suffix_len=8, num_conversations=2, num_turns=3,
                                 turn_len=16, reply_len=8, output_len=2)
    result = run_prefix(EngineConfig(model=str(tiny_llama), dtype="float32", max_model_len=256),
                        PrefixOptions(work, kv_fractions=(1.0, 0.2)), progress=False)
    d = result.data
    for name in ("shared_prefix", "chat_replay"):
        off, on = d["caching_off"][name], d["caching_on"][name]
        assert off["hit_rate"] == 0 and off["prompt_tokens_computed"] == off["prompt_tokens"]
        assert on["hit_rate"] > 0 and on["prompt_tokens_computed"] < on["prompt_tokens"]
        assert on["output_tokens"] == off["output_tokens"] == on["requests"] * 2
    # 3 of the 4 requests find the 4 full prefix blocks (64 of their 72 tokens)
    shared = d["caching_on"]["shared_prefix"]
    assert shared["prefix_cache_hits"] == 3 * 64 and shared["prefix_cache_queries"] == 4 * 72
    sweep = {(s["workload"], s["kv_fraction"]): s for s in d["eviction_sweep"]}
    chat_full, chat_small = sweep[("chat_replay", 1.0)], sweep[("chat_replay", 0.2)]
    assert chat_small["num_kv_blocks"] < chat_full["num_kv_blocks"] == d["footprint_blocks"]["chat_replay"]
    assert chat_small["hit_rate"] <= chat_full["hit_rate"]
    assert chat_full["hit_rate"] == d["caching_on"]["chat_replay"]["hit_rate"]  # nothing evicted at full size
    assert "off (baseline)" in [row[1] for row in result.tables[0].rows]
