"""The load generator of ``cinq bench serve``: streaming /v1/completions requests sent with Poisson arrivals,
each timed as the client reads its server-sent events."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cinq.bench.workload import BenchRequest


@dataclass(slots=True)
class ClientResult:
    """One request as the client saw it (seconds)."""

    ok: bool
    prompt_len: int
    output_len: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


async def one_request(client: Any, url: str, model: str | None, prompt: list[int], max_tokens: int) -> ClientResult:
    """Send one streaming completion and time its tokens (usage in every chunk says how many so far)."""
    import httpx
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                            "stream": True,
                            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if model:
        body["model"] = model
    res = ClientResult(ok=False, prompt_len=len(prompt))
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = chunk["error"]["message"]
                    return res
                usage = chunk.get("usage") or {}
                tokens = usage.get("completion_tokens", res.output_len)
                if chunk.get("choices") and tokens > res.output_len:
                    now = time.perf_counter()
                    if res.output_len == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    res.output_len = tokens
        res.latency = time.perf_counter() - start
        res.ok = res.output_len == max_tokens
        if not res.ok:
            res.error = f"got {res.output_len} tokens, asked {max_tokens}"
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_rate(base_url: str, model: str | None, reqs: list[BenchRequest], rate: float, seed: int,
                   on_done: Callable[[], None] | None = None) -> tuple[list[ClientResult], float]:
    """Send every request, gaps drawn from an exponential distribution at ``rate`` per second (inf: all at
    once); returns the results in request order and the wall time until the last finished."""
    import httpx
    rng = random.Random(seed)
    url = base_url.rstrip("/") + "/v1/completions"
    limits = httpx.Limits(max_connections=len(reqs) + 8, max_keepalive_connections=len(reqs) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        for r in reqs:
            task = asyncio.ensure_future(one_request(client, url, model, r.prompt, r.output_len))
            if on_done is not None:
                task.add_done_callback(lambda _: on_done())
            tasks.append(task)
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start
