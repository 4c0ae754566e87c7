"""The OpenAI server over the 2-replica DPAsyncLLM (build_app unchanged): a streaming client whose replica is
killed mid-stream gets an error event and the end of the stream, not a hang; later requests are served."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from tests.dp.conftest import wait_all_alive

pytest.importorskip("ray")


class KeepRunning:
    """The session's DPAsyncLLM for ``build_app``, minus the shutdown at the app's end (the fixture owns it)."""

    def __init__(self, llm) -> None:
        self._llm = llm

    def __getattr__(self, name: str):
        return getattr(self._llm, name)

    async def shutdown_async(self, timeout: float = 10.0) -> None:
        return None


@pytest.fixture()
def dp_server(dp_llm, dp_loop) -> Iterator[str]:
    """The app served on the DP front end's own event loop (so every call into it runs there)."""
    import uvicorn

    from cinq.server.app import build_app
    from cinq.server.connections import ConnectionLimits, uvicorn_config

    app = build_app(KeepRunning(dp_llm), ["tiny"], "tiny")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn_config(app, ConnectionLimits(), graceful_shutdown=2))
    done = asyncio.run_coroutine_threadsafe(server.serve(sockets=[sock]), dp_loop.loop)
    deadline = time.monotonic() + 30
    while not server.started:
        assert not done.done() and time.monotonic() < deadline, "the DP test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        done.result(15)
        sock.close()


def test_stream_cut_by_a_dead_replica_ends_with_an_error_event(dp_llm, dp_server) -> None:
    import ray

    wait_all_alive(dp_llm)
    body = {"prompt": list(range(3, 43)), "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
    events: list[dict] = []
    done = False
    with httpx.stream("POST", dp_server + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            events.append(json.loads(line[len("data: "):]))
            if len(events) == 1:  # streaming now: kill the replica that serves it
                (serving,) = [rep for rep in dp_llm.replicas if rep.in_flight]
                ray.kill(serving.handle, no_restart=True)
    errors = [e for e in events if "error" in e]
    assert len(errors) == 1 and events[-1] is errors[0], events[-3:]
    assert errors[0]["error"]["code"] == "engine_error" and "died while streaming" in errors[0]["error"]["message"]
    assert len(events) < 400  # it was cut, not completed
    assert done  # the error event, then the stream's usual end: the client is not left waiting
    # The other replica serves while the dead one restarts; then both do.
    out = httpx.post(dp_server + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}, timeout=60).json()
    assert out["usage"]["completion_tokens"] == 2
    wait_all_alive(dp_llm)
