"""DPAsyncLLM on a local Ray cluster (2 replicas of the tiny model): routing, prefix affinity measured in the
replicas' own prefix caches, errors and aborts, and a replica killed mid-load."""

from __future__ import annotations

import asyncio
import time

import pytest

from cinq.errors import InvalidParameterError
from cinq.outputs import RequestOutput
from cinq.sampling_params import SamplingParams
from tests.dp.conftest import wait_all_alive

ray = pytest.importorskip("ray")

GREEDY = dict(temperature=0.0, ignore_eos=True)


def shared_prefix(group: int, length: int = 40) -> list[int]:
    """A prompt head of ``length`` tokens (two full 16-token blocks and some) unique to ``group``."""
    return [(7 * group + i) % 200 + 3 for i in range(length)]


async def collect(llm, prompt: list[int], rid: str, max_tokens: int = 4) -> RequestOutput:
    last = None
    async for out in llm.generate(prompt, SamplingParams(max_tokens=max_tokens, **GREEDY), rid):
        last = out
    return last


def replica_hits(llm) -> tuple[int, int]:
    """Prefix-cache (hits, queries) over all replicas, read from them now (not from the polled snapshots)."""
    snaps = ray.get([r.handle.snapshot.remote() for r in llm.replicas])
    return sum(s.stats.prefix_cache_hits for s in snaps), sum(s.stats.prefix_cache_queries for s in snaps)


def test_requests_spread_over_replicas_and_agree(dp_llm, dp_loop) -> None:
    wait_all_alive(dp_llm)
    routed_before = list(dp_llm.counters.routed)

    async def run() -> list[RequestOutput]:
        return await asyncio.gather(*(collect(dp_llm, shared_prefix(g) + [5], f"spread-{g}") for g in range(4)))

    outs = dp_loop.run(run())
    assert all(o.finished and len(o.outputs[0].token_ids) == 4 for o in outs)
    routed = [after - before for after, before in zip(dp_llm.counters.routed, routed_before)]
    assert sum(routed) == 4 and min(routed) >= 1  # new prefixes go to the less loaded replica
    # The same prompt twice at once, least-loaded: one copy per replica (same weights, greedy: same tokens).
    dp_llm.router.config.policy = "least_loaded"
    try:
        pair = dp_loop.run(same_prompt_twice(dp_llm, shared_prefix(99) + [9]))
    finally:
        dp_llm.router.config.policy = "prefix"
    assert {index for index, _ in pair} == {0, 1}
    assert pair[0][1] == pair[1][1]


async def same_prompt_twice(llm, prompt: list[int]) -> list[tuple[int, list[int]]]:
    params = SamplingParams(max_tokens=6, **GREEDY)
    streams = await asyncio.gather(*(llm.add_request(f"twice-{i}", prompt, params) for i in range(2)))
    indices = [s.replica.index for s in streams]
    results = []
    for index, stream in zip(indices, streams):
        last = None
        async for out in stream:
            last = out
        results.append((index, last.outputs[0].token_ids))
    return results


def test_prefix_affinity_raises_the_replicas_hit_rate(dp_llm, dp_loop) -> None:
    """Sequential requests over 6 shared prefixes of 2 blocks, each replica's cache holding 64 blocks of which
    the running request takes ~4: with affinity every prefix stays on one replica (1 miss each); routed at
    random, a prefix is computed once on each replica it lands on."""
    wait_all_alive(dp_llm)
    rates = {}
    for k, policy in enumerate(("prefix", "random")):
        dp_llm.router.config.policy = policy
        h0, q0 = replica_hits(dp_llm)

        async def run() -> None:
            for i in range(24):
                group = 100 + 10 * k + i % 6
                await collect(dp_llm, shared_prefix(group, 32) + [i + 3], f"aff-{policy}-{i}", max_tokens=1)

        dp_loop.run(run())
        time.sleep(0.7)  # each replica publishes its stats at least every 0.5 s
        h1, q1 = replica_hits(dp_llm)
        rates[policy] = (h1 - h0) / (q1 - q0)
    dp_llm.router.config.policy = "prefix"
    assert rates["prefix"] > rates["random"], rates


def test_validation_error_comes_back_as_itself(dp_llm, dp_loop) -> None:
    wait_all_alive(dp_llm)
    with pytest.raises(InvalidParameterError) as e:
        dp_loop.run(collect(dp_llm, [1, 2, 10**9], "bad-token"))
    assert e.value.param == "prompt"  # the replica's own error type and field survive Ray
    assert all(r.in_flight == 0 for r in dp_llm.replicas)


def test_abort_frees_the_request_on_its_replica(dp_llm, dp_loop) -> None:
    wait_all_alive(dp_llm)
    aborted = dp_llm.counters.aborted

    async def run() -> int:
        stream = await dp_llm.add_request("abort-me", shared_prefix(50), SamplingParams(max_tokens=400, **GREEDY))
        replica = stream.replica
        await stream.__anext__()
        stream.abort()
        assert replica.in_flight == 0
        return replica.index

    index = dp_loop.run(run())
    assert dp_llm.counters.aborted == aborted + 1
    handle = dp_llm.replicas[index].handle
    deadline = time.monotonic() + 10
    while ray.get(handle.snapshot.remote()).stats.num_running:
        assert time.monotonic() < deadline, "the aborted request kept running on its replica"
        time.sleep(0.1)


def test_killed_replica_resends_waiting_requests_and_fails_streaming_ones(dp_llm, dp_loop) -> None:
    """One request streams on a replica while three more wait behind it there (max_num_seqs=1, same prefix, so
    affinity puts them together); the replica is killed: the streaming one ends with ReplicaFailedError, the
    waiting ones are re-sent to the other replica and complete, and the dead replica is restarted."""
    from cinq.dp.request_stream import ReplicaFailedError

    wait_all_alive(dp_llm)
    c0 = dp_llm.counters
    before = (c0.retried, c0.failed, c0.completed, c0.restarts, c0.aborted)
    prefix = shared_prefix(77)

    async def run() -> list[object]:
        long = await dp_llm.add_request("victim", prefix + [1], SamplingParams(max_tokens=400, **GREEDY))
        first = await long.__anext__()  # it is streaming now
        assert not first.finished
        waiting = [await dp_llm.add_request(f"waiter-{i}", prefix + [i + 2], SamplingParams(max_tokens=3, **GREEDY))
                   for i in range(3)]
        replica = long.replica
        assert all(s.replica is replica for s in waiting)  # affinity: all on the streaming one's replica
        ray.kill(replica.handle, no_restart=True)

        async def drain(stream) -> object:
            last = None
            try:
                async for out in stream:
                    last = out
            except Exception as e:
                return e
            return last

        return await asyncio.wait_for(asyncio.gather(*(drain(s) for s in [long] + waiting)), 60)

    results = dp_loop.run(run())
    assert isinstance(results[0], ReplicaFailedError)
    for out in results[1:]:
        assert isinstance(out, RequestOutput) and out.finished and len(out.outputs[0].token_ids) == 3
    c = dp_llm.counters
    assert c.retried - before[0] == 3
    assert c.failed - before[1] == 1
    assert c.completed - before[2] == 3
    assert c.aborted == before[4]  # all four accounted for as completed or failed
    wait_all_alive(dp_llm)
    assert c.restarts - before[3] == 1
    assert all(r.in_flight == 0 for r in dp_llm.replicas)
    # The restarted replica serves again.
    async def two_more() -> list[RequestOutput]:
        return await asyncio.gather(*(collect(dp_llm, shared_prefix(g) + [4], f"after-{g}") for g in (200, 201)))

    outs = dp_loop.run(two_more())
    assert all(o.finished for o in outs)


def test_more_replicas_than_the_cluster_can_place_is_refused(ray_cluster, tiny_llama) -> None:
    from cinq.config import EngineConfig
    from cinq.dp.dp_engine import DPAsyncLLM

    config = EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=16)
    with pytest.raises(InvalidParameterError) as e:
        DPAsyncLLM(config, 3)  # 1 CPU per replica, 2 in the cluster
    assert e.value.param == "data_parallel_size" and "needs 3 CPU" in str(e.value)


def test_a_replica_failure_is_an_engine_error_for_the_server() -> None:
    """What a client whose stream was cut by a replica's death receives (as an SSE error event mid-stream)."""
    from cinq.dp.request_stream import ReplicaFailedError
    from cinq.server.errors import to_api_error

    err = to_api_error(ReplicaFailedError("data-parallel replica 1 died while streaming request r"))
    body = err.body()
    assert err.status == 500 and body["error"]["code"] == "engine_error"
    assert "replica 1 died" in body["error"]["message"]
