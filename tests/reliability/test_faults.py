"""Engine fault isolation: an exception inside one request's processing (injected with cinq.engine.faults at the
detokenizer or the stop check) fails that request alone — offline it comes back with finish_reason "error", through
AsyncLLM its stream raises RequestFailedError, through the server it is a 500 JSON or an error event — while the
engine loop and every other request go on and its KV blocks are freed."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cinq import LLM, SamplingParams
from cinq.config import EngineConfig
from cinq.engine.async_engine import AsyncLLM, RequestFailedError
from cinq.engine.engine import LLMEngine
from cinq.engine.faults import inject_fault
from cinq.sampling_params import OutputKind
from tests.server.harness import MODEL_NAME, serve

MARK = [7, 7, 7]  # prompts starting with these token ids get the fault
BAD = MARK + [72, 101, 108, 108, 111]
GOOD = [[5, 72, 101, 108, 108, 111], [5, 119, 111, 114, 108, 100], [5, 33, 34, 35, 36, 37]]
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def marked(_rid: str, prompt: list[int]) -> bool:
    return prompt[:len(MARK)] == MARK


@pytest.mark.parametrize("site", ["detokenize", "stop_check"])
def test_offline_failure_ends_that_request_alone(tiny_llama, site):
    llm = LLM(tiny_llama, dtype="float32", num_kv_blocks=64, block_size=8)
    alone = llm.generate(GOOD, PARAMS)
    remove = inject_fault(llm.engine, site, marked, after_tokens=3)
    outs = llm.generate([GOOD[0], BAD, GOOD[1], GOOD[2]], [PARAMS, PARAMS.clone(n=2), PARAMS, PARAMS])
    failed = outs[1]
    assert failed.finished and [c.finish_reason for c in failed.outputs] == ["error", "error"]
    assert "InjectedFault" in llm.errors[failed.request_id]
    assert all(0 < len(c.token_ids) <= 4 for c in failed.outputs)  # it ran, then stopped at the fault
    for got, ref in zip([outs[0], outs[2], outs[3]], alone):  # the others are exactly what they are alone
        assert got.outputs[0].token_ids == ref.outputs[0].token_ids and got.outputs[0].finish_reason == "length"
    engine = llm.engine
    assert engine.kv.num_free_blocks == 64 and not engine.has_unfinished_requests()
    assert not engine.scheduler.requests and not engine.output_processor.parents
    assert engine.get_stats().finished_by_reason["error"] == 2
    remove()
    assert llm.generate([BAD], PARAMS)[0].outputs[0].finish_reason == "length"  # the fault is gone


def test_async_failure_raises_on_that_stream_only(tiny_llama):
    engine = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=8))
    llm = AsyncLLM(engine)
    inject_fault(engine, "detokenize", marked, after_tokens=2)
    delta = PARAMS.clone(output_kind=OutputKind.DELTA, max_tokens=30)

    async def collect(rid: str, prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        async for out in llm.generate(prompt, delta, rid):
            tokens += out.outputs[0].token_ids
        return tokens

    async def go():
        llm.start()
        try:
            results = await asyncio.gather(collect("a", GOOD[0]), collect("bad", BAD), collect("b", GOOD[1]),
                                           return_exceptions=True)
            after = await collect("after", GOOD[2])  # the loop still serves new requests
            return results, after
        finally:
            await llm.shutdown_async()

    (a, bad, b), after = asyncio.run(go())
    assert isinstance(bad, RequestFailedError) and "InjectedFault" in str(bad)
    assert len(a) == len(b) == len(after) == 30
    assert llm.num_step_failures == 0  # no step failed: one request did
    assert engine.kv.num_free_blocks == 64 and not engine.has_unfinished_requests()


def test_server_answers_500_or_an_error_event_for_that_request_only(tiny_llama):
    with serve(tiny_llama) as server:
        inject_fault(server.engine, "stop_check", lambda _r, p: p[:len(MARK)] == MARK, after_tokens=1)
        body = {"model": MODEL_NAME, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        with httpx.Client(timeout=30) as client:
            resp = client.post(server.api + "/completions", json={**body, "prompt": BAD})
            assert resp.status_code == 500
            err = resp.json()["error"]
            assert err["code"] == "engine_error" and "InjectedFault" in err["message"]
            with client.stream("POST", server.api + "/completions",
                               json={**body, "prompt": BAD, "stream": True}) as stream:
                assert stream.status_code == 200
                lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
            assert "engine_error" in lines[-2] and lines[-1] == "data: [DONE]"
            ok = client.post(server.api + "/completions", json={**body, "prompt": GOOD[0]})
            assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
            chat = client.post(server.api + "/chat/completions",
                               json={**body, "messages": [{"role": "user", "content": "hi"}]})
            assert chat.status_code == 200
            assert client.get(server.url + "/health").status_code == 200
        stats = server.wait_idle()
        assert stats["step_failures"] == 0 and stats["finished_by_reason"]["error"] == 2
        assert server.engine.kv.num_free_blocks == server.engine.num_blocks
