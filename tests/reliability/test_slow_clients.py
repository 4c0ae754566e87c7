"""Slow and stalled clients, over raw sockets against a live server with a 1 s request timeout: a connection that
sends nothing, half its headers, or headers and half a body gets a 408 JSON (when it can still read one) and is
closed within the timeout (+ slack); many at once are all closed while the server keeps answering others;
complete requests, slow-but-in-time uploads and long streams are never cut; --limit-concurrency answers 503."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from cinq.server.connections import ConnectionLimits
from tests.server.harness import MODEL_NAME, serve

TIMEOUT = 1.0
SLACK = 1.5  # event-loop and scheduling delay allowed past the deadline on a loaded 2-core machine
BODY = json.dumps({"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2, "ignore_eos": True}).encode()


def _head(length: int) -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {length}\r\n\r\n").encode()


@pytest.fixture(scope="module")
def server(tiny_llama):
    with serve(tiny_llama, num_kv_blocks=128, limits=ConnectionLimits(request_timeout=TIMEOUT,
                                                                      limit_concurrency=None)) as s:
        yield s


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT + SLACK + 5)
    return sock


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long after the call that took."""
    start, data = time.monotonic(), b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - start


STALLS = {
    "nothing": b"",
    "half the headers": b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-le",
    "headers and half a body": _head(len(BODY)) + BODY[: len(BODY) // 2],
}


@pytest.mark.parametrize("sent", list(STALLS.values()), ids=list(STALLS))
def test_stalled_request_gets_408_and_is_closed(server, sent):
    with _connect(server.url) as sock:
        t0 = time.monotonic()
        sock.sendall(sent)
        data, _ = _read_until_closed(sock)
        held = time.monotonic() - t0
    assert TIMEOUT - 0.05 <= held <= TIMEOUT + SLACK, held
    status, _, rest = data.partition(b"\r\n")
    assert status == b"HTTP/1.1 408 Request Timeout", data
    assert b"connection: close" in rest.lower()
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


def test_many_stalled_connections_are_all_closed_and_others_are_served(server):
    n = 200
    socks = [_connect(server.url) for _ in range(n)]
    try:
        t0 = time.monotonic()
        for i, s in enumerate(socks):
            s.sendall(list(STALLS.values())[i % 3])
        # while they stall, a normal client is answered at once
        ok = httpx.post(server.url + "/v1/completions", content=BODY, timeout=10,
                        headers={"content-type": "application/json"})
        assert ok.status_code == 200  # answered while all of them stall (httpx gives up after 10 s)
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(_read_until_closed, socks))
        elapsed = time.monotonic() - t0
    finally:
        for s in socks:
            s.close()
    timed_out = sum(r[0].startswith(b"HTTP/1.1 408") for r in results)
    print(f"slow clients: {timed_out}/{n} got 408, all closed {elapsed:.2f} s after they started "
          f"(timeout {TIMEOUT} s)")
    assert timed_out == n, f"{timed_out}/{n} got 408"  # closed by the server's timeout, not by the readers
    deadline = time.monotonic() + 5
    while len(server.server.server_state.connections) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(server.server.server_state.connections) == 0  # no descriptor or task left behind
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    server.wait_idle()


def test_slow_upload_within_the_deadline_is_served(server):
    with _connect(server.url) as sock:
        sock.sendall(_head(len(BODY)))
        for i in range(0, len(BODY), 8):  # the body in pieces over ~0.5 s: slow, but whole in time
            sock.sendall(BODY[i:i + 8])
            time.sleep(0.5 / (len(BODY) / 8))
        sock.shutdown(socket.SHUT_WR)
        data, _ = _read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]


def test_keep_alive_requests_each_get_their_own_deadline(server):
    with _connect(server.url) as sock:
        for _ in range(3):  # three requests on one connection, spread over > the timeout
            sock.sendall(_head(len(BODY)) + BODY)
            buf = b""
            while b'"usage"' not in buf:
                buf += sock.recv(65536)
            assert buf.startswith(b"HTTP/1.1 200"), buf[:200]
            time.sleep(TIMEOUT * 0.6)


def test_long_stream_outlives_the_request_timeout(server, monkeypatch):
    real = server.engine.step

    def slow_step():
        time.sleep(0.02)
        return real()

    monkeypatch.setattr(server.engine, "step", slow_step)
    t0 = time.monotonic()
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30, json={
            "model": MODEL_NAME, "prompt": "x", "max_tokens": 100, "ignore_eos": True, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert time.monotonic() - t0 > 2 * TIMEOUT  # the stream ran well past the deadline and was not cut
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
    monkeypatch.undo()
    server.wait_idle()


def test_limit_concurrency_answers_503(tiny_llama):
    limit = 4
    with serve(tiny_llama, num_kv_blocks=32, limits=ConnectionLimits(request_timeout=TIMEOUT,
                                                                     limit_concurrency=limit)) as s:
        # uvicorn counts open connections, the new one included: limit - 1 held ones fill it
        held = [_connect(s.url) for _ in range(limit - 1)]
        try:
            for sock in held:
                sock.sendall(STALLS["headers and half a body"])
            time.sleep(0.2)
            assert len(s.server.server_state.connections) == limit - 1  # accepted, waiting for their bodies
            r = httpx.post(s.url + "/v1/completions", content=BODY, timeout=10,
                           headers={"content-type": "application/json"})
            assert r.status_code == 503, r.text
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.3)  # the held connections are gone: capacity is back
        ok = httpx.post(s.url + "/v1/completions", content=BODY, timeout=10,
                        headers={"content-type": "application/json"})
        assert ok.status_code == 200, ok.text


def test_limits_are_validated():
    from cinq.errors import InvalidParameterError
    for bad in (ConnectionLimits(request_timeout=0), ConnectionLimits(limit_concurrency=1)):
        with pytest.raises(InvalidParameterError):
            bad.validate()


def test_serve_defaults_match_the_server_module():
    from cinq.commands import serve as serve_cmd
    from cinq.server import connections
    assert serve_cmd.DEFAULT_REQUEST_TIMEOUT == connections.DEFAULT_REQUEST_TIMEOUT
    assert serve_cmd.DEFAULT_LIMIT_CONCURRENCY == connections.DEFAULT_LIMIT_CONCURRENCY
