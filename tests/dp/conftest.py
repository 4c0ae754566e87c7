"""A local Ray cluster (2 CPUs) with one 2-replica DPAsyncLLM on the tiny model, shared by the tests of this
package, and an event loop in a thread to drive it (as the server's loop does)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest


class LoopThread:
    """An asyncio loop running in a daemon thread; ``run`` executes a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="dp-test-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    ray = pytest.importorskip("ray")  # an optional extra: without it the Ray tests skip, the rest run
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def dp_loop() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


@pytest.fixture(scope="session")
def dp_llm(ray_cluster, dp_loop, tiny_llama):
    """Two replicas of the tiny model; one sequence runs at a time per replica, so later requests wait (and
    deliver nothing) while the first streams: the failure test relies on it."""
    from cinq.config import EngineConfig
    from cinq.dp.dp_engine import DPAsyncLLM
    from cinq.dp.router import RouterConfig

    config = EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=16, max_num_seqs=1)
    llm = DPAsyncLLM(config, 2, router_config=RouterConfig(block_size=16, seed=0), replica_num_cpus=1)

    async def start() -> None:
        llm.start()

    dp_loop.run(start())
    yield llm
    dp_loop.run(llm.shutdown_async())


def wait_all_alive(llm, timeout: float = 90.0) -> None:
    """Until every replica is up again (a killed one is re-created in the background); a bounded wait."""
    deadline = time.monotonic() + timeout
    while not all(r.alive for r in llm.replicas):
        assert time.monotonic() < deadline, "a replica was not restarted"
        time.sleep(0.1)
