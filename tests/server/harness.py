"""Test servers: the real app under uvicorn on a free loopback port, in a thread of the test process (so a test
can also look at the engine behind it).

``engine_core``: "inproc" (the default: tests that look into the engine, ``server.engine``, need it in this
process) or "process" (the engine core in its own process, as ``cinq serve`` runs it). ``CINQ_TEST_ENGINE_CORE``
changes the default, so a suite can be run against the split server as it is:
``CINQ_TEST_ENGINE_CORE=process pytest tests/reliability``."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

MODEL_NAME = "tiny"


@dataclass
class RunningServer:
    url: str
    llm: object  # AsyncLLM
    model_path: Path
    server: object = None  # the uvicorn.Server (its server_state counts connections and tasks)
    app: object = None  # the FastAPI app (app.state.ctx: the ServerContext)

    @property
    def engine(self):
        """The LLMEngine behind an in-process server; for a split server a ``CoreStatsView`` (what tests read of
        the engine, from the stats its core publishes; nothing there can be patched)."""
        if hasattr(self.llm, "engine"):
            return self.llm.engine
        return CoreStatsView(self.llm)

    @property
    def core_pid(self) -> int | None:
        """The engine core's process (None in-process)."""
        return getattr(self.llm, "core_pid", None)

    @property
    def api(self) -> str:
        return self.url + "/v1"

    def stats(self) -> dict:
        return httpx.get(self.url + "/stats", timeout=10).json()

    def wait_idle(self, timeout: float = 20.0) -> dict:
        """Wait until no request runs or waits and no KV block is held by a live request."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if s["num_requests_running"] == 0 and s["num_requests_waiting"] == 0 and s["kv_cache_usage"] == 0:
                return s
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not idle: {s}")
            time.sleep(0.05)


class CoreStatsView:
    """``server.engine`` of a server whose engine core runs in another process: the engine's read-only numbers,
    from the core's published stats (``EngineClient.get_stats``) and its start-up limits."""

    def __init__(self, llm: object) -> None:
        self._llm = llm

    @property
    def kv(self) -> CoreStatsView:
        return self

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - round(self._llm.get_stats().kv_cache_usage * self.num_blocks)

    def __getattr__(self, name: str):  # num_blocks, max_model_len, vocab_size, get_stats, config, ...
        return getattr(self._llm, name)

    def has_unfinished_requests(self) -> bool:
        s = self._llm.get_stats()
        return s.num_running + s.num_waiting > 0


@contextmanager
def serve(model: Path, api_key: str | None = None, max_waiting_requests: int | None = None,
          limits: object | None = None, metrics_require_api_key: bool = False, engine_core: str | None = None,
          on_core_start: object | None = None, **engine_args: object) -> Iterator[RunningServer]:
    """A live server as `cinq serve` builds it (same app, same uvicorn config); ``limits``: a
    ``ConnectionLimits`` (default: cinq serve's defaults); ``engine_core``: see the module docstring;
    ``on_core_start``: a fault to inject in a core process (``AsyncMPLLM``'s argument; implies "process")."""
    import uvicorn

    from cinq.config import EngineConfig
    from cinq.engine.protocol import make_engine_client
    from cinq.server.app import build_app
    from cinq.server.connections import ConnectionLimits, uvicorn_config

    args = {"dtype": "float32", "num_kv_blocks": 512, "block_size": 16, **engine_args}
    config = EngineConfig.from_kwargs(str(model), **args)
    if on_core_start is not None:
        from cinq.engine.async_mp_llm import AsyncMPLLM
        llm = AsyncMPLLM(config, max_waiting_requests, on_core_start=on_core_start)
    else:
        mode = engine_core or os.environ.get("CINQ_TEST_ENGINE_CORE", "inproc")
        llm = make_engine_client(config, max_waiting_requests, mode)
    app = build_app(llm, [MODEL_NAME], str(model), api_key, metrics_require_api_key)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, limits or ConnectionLimits(), graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            llm.shutdown()
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", llm, model, server, app)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        llm.shutdown()  # the app's lifespan did already; a no-op then (a core process must never outlive a test)
