"""Overload at 4x the KV capacity: 128 concurrent streams on a cache of 256 blocks all complete (preempted and
recomputed, never failed), and every block is free afterwards; seeded requests give the same text under that
load as alone (batch invariance)."""

from __future__ import annotations

import asyncio

import httpx

from benchmarks.reliability import overload, probe_request, send
from tests.server.harness import MODEL_NAME, serve


def test_128_streams_on_256_blocks_all_complete_with_preemptions(tiny_llama):
    with serve(tiny_llama, num_kv_blocks=256, block_size=16, max_num_seqs=128) as server:
        # ~40 prompt tokens + 80 generated = 8 blocks each: 1024 blocks of demand on 256
        res = asyncio.run(overload(server.url, MODEL_NAME, streams=128, prompt_words=8, max_tokens=80))
        assert res["completed"] == 128 and res["failed"] == 0, res["errors"]
        assert res["preemptions"] > 0
        assert res["free_blocks_after"] == 256 and server.engine.kv.num_free_blocks == 256
        assert res["step_failures"] == 0


def test_seeded_requests_are_identical_under_load_and_alone(tiny_llama):
    probes = [probe_request(k, MODEL_NAME) for k in range(6)]  # sampled, seeded; n = 1 and 2, streamed or not
    with serve(tiny_llama, num_kv_blocks=256, block_size=16, max_num_seqs=64) as server:
        async def go():
            async with httpx.AsyncClient(timeout=120) as client:
                alone = [await send(client, server.url, p) for p in probes]
                load = asyncio.ensure_future(overload(server.url, MODEL_NAME, streams=48, prompt_words=8,
                                                      max_tokens=60))
                await asyncio.sleep(0.3)  # the load is running
                under = await asyncio.gather(*(send(client, server.url, p) for p in probes * 2))
                return alone, under, await load

        alone, under, load = asyncio.run(go())
    assert all(o.ok for o in alone + under) and load["failed"] == 0
    for i, out in enumerate(under):
        assert out.texts == alone[i % len(probes)].texts, f"probe {i % len(probes)} differs under load"
