"""AsyncLLM: the engine on its own thread behind asyncio — streamed deltas add up to the offline result, errors
reach the caller, aborts free blocks within one step, a failing step fails only the requests in flight, and the
waiting queue is bounded."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cinq import LLM, SamplingParams
from cinq.config import EngineConfig
from cinq.engine.async_engine import AsyncLLM, EngineDeadError, EngineOverloadedError, RequestFailedError
from cinq.engine.engine import LLMEngine
from cinq.errors import InvalidParameterError, PromptTooLongError
from cinq.sampling_params import OutputKind

PROMPT = [5, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]
DELTA = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, output_kind=OutputKind.DELTA)


def make(tiny_llama, max_waiting: int | None = None, **kw) -> AsyncLLM:
    args = {"dtype": "float32", "num_kv_blocks": 64, "block_size": 8, **kw}
    return AsyncLLM(LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), **args)), max_waiting)


def run(llm: AsyncLLM, coro_fn):
    async def main():
        llm.start()
        try:
            return await coro_fn()
        finally:
            llm.shutdown()
    return asyncio.run(main())


async def collect(llm: AsyncLLM, rid: str, prompt=PROMPT, params=DELTA):
    outs = [o async for o in llm.generate(prompt, params, rid)]
    return outs


def test_deltas_add_up_to_offline_result(tiny_llama):
    offline = LLM(tiny_llama, dtype="float32").generate([PROMPT], DELTA.clone(output_kind=OutputKind.FINAL_ONLY))[0]
    llm = make(tiny_llama)

    async def go():
        return await asyncio.gather(collect(llm, "a"), collect(llm, "b"))

    for outs in run(llm, go):
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert sum((o.outputs[0].token_ids for o in outs), []) == offline.outputs[0].token_ids
        assert "".join(o.outputs[0].text for o in outs) == offline.outputs[0].text
    assert llm.engine.kv.num_free_blocks == 64


def test_n_completions_stream_by_index(tiny_llama):
    llm = make(tiny_llama)
    params = SamplingParams(n=3, max_tokens=5, seed=1, ignore_eos=True, output_kind=OutputKind.DELTA)
    outs = run(llm, lambda: collect(llm, "n", params=params))
    per_index: dict[int, list[int]] = {}
    for o in outs:
        for c in o.outputs:
            per_index.setdefault(c.index, []).extend(c.token_ids)
    assert sorted(per_index) == [0, 1, 2] and all(len(t) == 5 for t in per_index.values())


def test_lagging_consumer_gets_merged_deltas(tiny_llama):
    params = SamplingParams(n=2, seed=3, max_tokens=20, ignore_eos=True, logprobs=2)
    offline = LLM(tiny_llama, dtype="float32").generate([PROMPT], params)[0]
    llm = make(tiny_llama)

    async def go():
        stream = await llm.add_request("slow", PROMPT, params.clone(output_kind=OutputKind.DELTA))
        await asyncio.sleep(1.0)  # the engine runs ahead; its outputs pile up in the request's queue
        return [o async for o in stream]

    outs = run(llm, go)
    assert len(outs) < 20 and outs[-1].finished
    for ref in offline.outputs:
        comps = [c for o in outs for c in o.outputs if c.index == ref.index]
        assert sum((c.token_ids for c in comps), []) == ref.token_ids
        assert "".join(c.text for c in comps) == ref.text
        assert len(sum((c.logprobs for c in comps), [])) == 20
        assert comps[-1].finish_reason == "length"


def test_validation_errors_reach_the_caller_and_the_loop_goes_on(tiny_llama):
    llm = make(tiny_llama)

    async def go():
        with pytest.raises(PromptTooLongError, match="512"):
            await llm.add_request("long", list(range(3, 250)) * 3, DELTA)
        with pytest.raises(InvalidParameterError, match="out of range"):
            await llm.add_request("bad", [1, 10**6], DELTA)
        stream = await llm.add_request("dup", PROMPT, DELTA)
        with pytest.raises(InvalidParameterError, match="already in use"):
            await llm.add_request("dup", PROMPT, DELTA)
        return [o async for o in stream]

    outs = run(llm, go)
    assert outs[-1].finished and sum(len(o.outputs[0].token_ids) for o in outs) == 20


def test_abort_frees_blocks_before_the_next_step(tiny_llama):
    llm = make(tiny_llama)
    engine = llm.engine
    real_step = engine.step
    aborted = threading.Event()
    victim_blocks_at_step_entry: list[int] = []

    def step():
        if aborted.is_set():
            victim_blocks_at_step_entry.append(len(engine.kv.block_ids("victim")))
        return real_step()

    engine.step = step
    params = SamplingParams(max_tokens=200, ignore_eos=True, output_kind=OutputKind.DELTA)

    async def go():
        # A second, long request keeps the engine stepping after the abort.
        other = asyncio.ensure_future(collect(llm, "other", params=params))
        gen = llm.generate(PROMPT * 3, params, "victim")
        async for _ in gen:
            break
        held = len(engine.kv.block_ids("victim"))
        aborted.set()
        await gen.aclose()  # the consumer leaves: AsyncLLM aborts the request
        await other
        return held

    held = run(llm, go)
    assert held > 0
    # Only a step already under way (or about to start) when the abort came may still see the request's
    # blocks; every later step finds them freed.
    steps = victim_blocks_at_step_entry
    assert len(steps) >= 3 and all(b == 0 for b in steps[1:]), steps
    assert engine.stats.finished_by_reason.get("abort") == 1
    assert engine.kv.num_free_blocks == 64


def test_failing_step_fails_only_requests_in_flight(tiny_llama):
    llm = make(tiny_llama)
    engine = llm.engine
    real_step = engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated kernel failure")
        return real_step()

    engine.step = flaky_step

    async def go():
        with pytest.raises(RequestFailedError, match="simulated kernel failure"):
            await collect(llm, "victim")
        return await collect(llm, "after")

    outs = run(llm, go)
    assert outs[-1].finished and sum(len(o.outputs[0].token_ids) for o in outs) == 20
    assert llm.num_step_failures == 1
    assert engine.kv.num_free_blocks == 64 and not engine.has_unfinished_requests()


def test_waiting_queue_is_bounded(tiny_llama):
    llm = make(tiny_llama, max_waiting=2, max_num_seqs=1)
    engine = llm.engine
    real_step = engine.step
    gate, entered = threading.Event(), threading.Event()

    def gated_step():
        entered.set()
        gate.wait(30)
        return real_step()

    engine.step = gated_step
    small = SamplingParams(max_tokens=2, ignore_eos=True, output_kind=OutputKind.DELTA)

    async def go():
        first = asyncio.ensure_future(collect(llm, "1", params=small))
        await asyncio.to_thread(entered.wait, 30)  # request 1 waits in the engine: 1 of 2
        second = asyncio.ensure_future(collect(llm, "2", params=small))
        while llm.num_waiting < 2:
            await asyncio.sleep(0.005)
        with pytest.raises(EngineOverloadedError) as err:
            await llm.add_request("3", PROMPT, small)
        assert err.value.retry_after >= 1
        gate.set()
        await asyncio.gather(first, second)
        entered.clear()
        gate.clear()
        third = asyncio.ensure_future(collect(llm, "4", params=small))
        await asyncio.to_thread(entered.wait, 30)
        while llm.num_waiting < 1:
            await asyncio.sleep(0.005)
        with pytest.raises(EngineOverloadedError):  # 1 waiting + n=2 > 2: n counts as n sequences
            await llm.add_request("4b", PROMPT, small.clone(n=2))
        gate.set()
        await third
        return await collect(llm, "5", params=small)

    outs = run(llm, go)
    assert outs[-1].finished
    assert llm.num_waiting == 0


def test_rejects_bad_bound():
    with pytest.raises(InvalidParameterError, match="max_waiting_requests"):
        AsyncLLM(engine=None, max_waiting_requests=0)  # type: ignore[arg-type]


def test_tokenizing_does_not_hold_the_command_lock(tiny_llama):
    """A long prompt tokenized on the engine thread must not block the event loop queueing other commands."""
    llm = make(tiny_llama)
    tok = llm.engine.tokenizer
    real_encode = tok.encode
    inside, release = threading.Event(), threading.Event()
    released: list[bool] = []  # False: the wait ran out, i.e. the loop was stuck behind the tokenizing thread

    def slow_encode(text, *args, **kwargs):
        if text.startswith("SLOW"):
            inside.set()
            released.append(release.wait(30))
        return real_encode(text, *args, **kwargs)

    tok.encode = slow_encode
    small = SamplingParams(max_tokens=2, ignore_eos=True, output_kind=OutputKind.DELTA)

    async def go():
        slow = asyncio.ensure_future(llm.add_request("slow", "SLOW hello", small))
        await asyncio.to_thread(inside.wait, 30)  # the engine thread is tokenizing now
        waiting = llm.num_waiting  # takes the command lock
        other = asyncio.ensure_future(llm.add_request("other", PROMPT, small))  # queues under the lock
        await asyncio.sleep(0)
        release.set()  # reached only if the loop was not held above
        streams = [await slow, await other]
        outs = [[o async for o in s] for s in streams]
        return waiting, outs

    waiting, outs = run(llm, go)
    assert released == [True], "the event loop waited on the engine's lock until the tokenizer gave up"
    assert waiting >= 0 and all(o[-1].finished for o in outs)


def test_shutdown_does_not_block_the_event_loop(tiny_llama):
    llm = make(tiny_llama)
    engine = llm.engine
    real_step = engine.step
    in_step, step_done = threading.Event(), threading.Event()

    def slow_step():
        in_step.set()
        time.sleep(1.0)
        step_done.set()
        return real_step()

    engine.step = slow_step
    params = SamplingParams(max_tokens=50, ignore_eos=True, output_kind=OutputKind.DELTA)

    async def go():
        llm.start()
        stream = await llm.add_request("r", PROMPT, params)
        await asyncio.to_thread(in_step.wait, 30)
        loop = asyncio.get_running_loop()
        llm.shutdown()  # on the loop: signals, does not join the thread in its 1 s step
        returned_before_the_step = not step_done.is_set()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        tick = asyncio.ensure_future(ticker())
        llm2 = make(tiny_llama)
        llm2.start()
        llm2.engine.step = slow_step
        await llm2.add_request("r2", PROMPT, params)
        in_step.clear()
        step_done.clear()
        await asyncio.to_thread(in_step.wait, 30)
        ticks_before = ticks
        await llm2.shutdown_async()  # waits for the thread, off the loop
        waited_for_the_step = step_done.is_set()
        tick.cancel()
        return returned_before_the_step, waited_for_the_step, ticks - ticks_before, llm2

    returned_before_the_step, waited_for_the_step, ticks, llm2 = asyncio.run(go())
    assert returned_before_the_step, "shutdown() on the loop waited for the engine thread's step"
    assert waited_for_the_step and ticks >= 1  # it did wait for the step, and the loop kept running meanwhile
    assert not llm.is_running and not llm2.is_running
    assert llm2._stopped_thread is None or not llm2._stopped_thread.is_alive()
