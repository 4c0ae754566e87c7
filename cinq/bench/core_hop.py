"""What the process hop costs one request: the same engine behind ``EngineClient`` with its core in this process
(``AsyncLLM``) and in its own (``AsyncMPLLM``), one request at a time, one output token each, end to end through
``generate()`` (no HTTP). The difference of the medians is the hop's latency: two ZMQ messages, their msgpack,
and the reader thread's handoff to the event loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from cinq.bench.latency_stats import summarize_ms
from cinq.config import EngineConfig
from cinq.engine.protocol import make_engine_client
from cinq.sampling_params import SamplingParams

PROMPT = [5, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]


def measure_hop(config: EngineConfig, num_requests: int = 40, warmup: int = 5) -> dict[str, Any]:
    """Per-request latency (ms: mean / median / p99) for each placement of the core, and the median's difference."""
    out: dict[str, Any] = {}
    for mode in ("inproc", "process"):
        llm = make_engine_client(config, None, mode)  # type: ignore[arg-type]
        out[mode] = summarize_ms(asyncio.run(_latencies(llm, num_requests, warmup)))
    out["overhead_ms"] = out["process"]["median"] - out["inproc"]["median"]
    out["num_requests"] = num_requests
    return out


async def _latencies(llm: Any, num_requests: int, warmup: int) -> list[float]:
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.start()
    try:
        times = []
        for i in range(warmup + num_requests):
            t0 = time.perf_counter()
            async for _ in llm.generate(PROMPT, params, f"hop-{i}"):
                pass
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        return times
    finally:
        await llm.shutdown_async()
