"""Test servers: the real app under uvicorn on a free loopback port, in a thread of the test process (so a test
can also look at the engine behind it)."""

from __future__ import annotations

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
        return self.llm.engine

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


@contextmanager
def serve(model: Path, api_key: str | None = None, max_waiting_requests: int | None = None,
          limits: object | None = None, metrics_require_api_key: bool = False,
          **engine_args: object) -> Iterator[RunningServer]:
    """A live server as `cinq serve` builds it (same app, same uvicorn config); ``limits``: a
    ``ConnectionLimits`` (default: cinq serve's defaults)."""
    import uvicorn

    from cinq.config import EngineConfig
    from cinq.engine.async_engine import AsyncLLM
    from cinq.engine.engine import LLMEngine
    from cinq.server.app import build_app
    from cinq.server.connections import ConnectionLimits, uvicorn_config

    args = {"dtype": "float32", "num_kv_blocks": 512, "block_size": 16, **engine_args}
    llm = AsyncLLM(LLMEngine(EngineConfig.from_kwargs(str(model), **args)), max_waiting_requests)
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
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", llm, model, server, app)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
