"""EngineReplica without Ray (it is plain Python; Ray only hosts it): the stream protocol, aborts at any point,
and errors before anything is yielded."""

from __future__ import annotations

import asyncio

import pytest

from cinq.config import EngineConfig
from cinq.dp.replica import ACCEPTED, EngineReplica
from cinq.errors import InvalidParameterError
from cinq.outputs import RequestOutput
from cinq.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def config(tiny_llama) -> EngineConfig:
    return EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=32)


def run(config: EngineConfig, body) -> object:
    async def main() -> object:
        replica = EngineReplica(config)
        info = await replica.ready()
        try:
            return await body(replica, info)
        finally:
            await replica.shutdown()
    return asyncio.run(main())


def test_stream_is_accepted_then_outputs_until_finished(config) -> None:
    async def body(replica, info) -> list:
        assert info.max_model_len > 0 and info.vocab_size > 0 and info.tokenizer.encode("hi")
        return [item async for item in replica.generate("r1", [1, 2, 3, 4], PARAMS, None, 0.0, None)]

    items = run(config, body)
    assert items[0] == ACCEPTED
    outs = items[1:]
    assert all(isinstance(o, RequestOutput) for o in outs) and outs[-1].finished
    assert len(outs[-1].outputs[0].token_ids) == 4


def test_validation_error_comes_before_anything_is_yielded(config) -> None:
    async def body(replica, info) -> None:
        gen = replica.generate("bad", [1, 10**9], PARAMS, None, 0.0, None)
        with pytest.raises(InvalidParameterError):
            await gen.__anext__()

    run(config, body)


def test_abort_ends_the_stream_and_frees_the_engine(config) -> None:
    async def body(replica, info) -> int:
        long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)

        async def consume() -> list:
            return [item async for item in replica.generate("long", [1, 2, 3], long, None, 0.0, None)]

        task = asyncio.ensure_future(consume())
        while replica.llm.get_stats().num_running == 0:  # wait until it runs in the engine
            await asyncio.sleep(0.01)
        await replica.abort("long")
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):  # the engine frees it before its next step
            if replica.llm.get_stats().num_running == 0 and replica.llm.get_stats().kv_cache_usage == 0:
                break
            await asyncio.sleep(0.02)
        stats = replica.llm.get_stats()
        return stats.num_running + stats.kv_cache_usage

    assert run(config, body) == 0


def test_an_abort_that_overtakes_its_generate_call_drops_the_request(config) -> None:
    async def body(replica, info) -> list:
        await replica.abort("early")
        return [item async for item in replica.generate("early", [1, 2, 3], PARAMS, None, 0.0, None)]

    assert run(config, body) == []
