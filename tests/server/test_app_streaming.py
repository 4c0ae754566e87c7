"""Load-side behaviour: clients that go away are aborted and their KV blocks freed, many concurrent streams all
complete with the same text as alone, and a full waiting queue answers 503 + Retry-After instead of growing."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.server.harness import MODEL_NAME, serve


@pytest.fixture
def slow_steps(server, monkeypatch):
    """Make each engine step take >= 10 ms so a long request is surely still running when the client leaves."""
    engine = server.engine
    real = engine.step

    def step():
        time.sleep(0.01)
        return real()

    monkeypatch.setattr(engine, "step", step)
    yield
    monkeypatch.undo()
    server.wait_idle()


LONG = {"model": MODEL_NAME, "prompt": "x" * 40, "max_tokens": 450, "ignore_eos": True}


def test_disconnect_mid_stream_aborts_and_frees_blocks(server, slow_steps):
    before = server.wait_idle()
    total = server.engine.num_blocks
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", server.api + "/completions", json={**LONG, "stream": True}) as resp:
            assert resp.status_code == 200
            seen = 0
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    seen += 1
                if seen == 3:
                    break
            assert server.engine.kv.num_free_blocks < total  # the request holds blocks now
    after = server.wait_idle()
    assert server.engine.kv.num_free_blocks == total
    assert after["finished_by_reason"].get("abort", 0) == before["finished_by_reason"].get("abort", 0) + 1
    assert after["generation_tokens"] - before["generation_tokens"] < LONG["max_tokens"]


def test_disconnect_while_waiting_for_whole_response_aborts(server, slow_steps):
    before = server.wait_idle()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.api + "/completions", json=LONG, timeout=httpx.Timeout(30, read=0.5))
    after = server.wait_idle()
    assert after["finished_by_reason"].get("abort", 0) == before["finished_by_reason"].get("abort", 0) + 1
    assert after["generation_tokens"] - before["generation_tokens"] < LONG["max_tokens"]
    assert server.engine.kv.num_free_blocks == server.engine.num_blocks


def test_fifty_concurrent_streams_complete(server):
    prompts = [f"request {i}: " + "ab" * (i % 7) for i in range(50)]
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    alone = {p: client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=8, temperature=0.0,
                                          extra_body={"ignore_eos": True}).choices[0].text for p in prompts[:3]}

    async def one(aclient: openai.AsyncOpenAI, prompt: str) -> tuple[str, str, int]:
        stream = await aclient.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0.0,
                                                  stream=True, stream_options={"include_usage": True},
                                                  extra_body={"ignore_eos": True})
        text, reason, usage = "", None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            for c in chunk.choices:
                text += c.text
                reason = c.finish_reason or reason
        return text, reason, usage

    async def main() -> list:
        async with openai.AsyncOpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120) as ac:
            return await asyncio.gather(*(one(ac, p) for p in prompts))

    results = asyncio.run(main())
    assert len(results) == 50
    assert all(reason == "length" and usage == 8 for _, reason, usage in results)
    for p, (text, _, _) in zip(prompts, results):
        if p in alone:
            assert text == alone[p]  # batching with 49 others does not change greedy output (fp32)
    server.wait_idle()


def test_full_waiting_queue_answers_503_with_retry_after(tiny_llama):
    with serve(tiny_llama, max_waiting_requests=2, max_num_seqs=1) as srv:
        gate, entered = threading.Event(), threading.Event()
        real = srv.engine.step

        def gated_step():
            entered.set()
            gate.wait(30)
            return real()

        srv.engine.step = gated_step
        body = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 3, "ignore_eos": True}
        url = srv.api + "/completions"
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(httpx.post, url, json=body, timeout=60)
            assert entered.wait(30)  # the engine holds request 1 in its waiting queue: 1 of 2
            second = pool.submit(httpx.post, url, json=body, timeout=60)
            deadline = time.monotonic() + 30
            while srv.llm.num_waiting < 2:  # request 2 queued for the engine: 2 of 2
                assert time.monotonic() < deadline
                time.sleep(0.01)
            third = httpx.post(url, json=body, timeout=30)
            assert third.status_code == 503
            assert int(third.headers["retry-after"]) >= 1
            assert third.json()["error"]["code"] == "overloaded"
            gate.set()
            assert first.result().status_code == 200
            assert second.result().status_code == 200
        srv.engine.step = real
        again = httpx.post(url, json=body, timeout=30)
        assert again.status_code == 200
