"""How the server holds connections: a deadline on every incomplete request, a cap on concurrency, and the uvicorn
configuration that `cinq serve` and the test servers share.

uvicorn times out only idle keep-alive connections: a client that opens a connection and sends nothing, sends
half its headers, or sends headers and half a body is held for as long as it likes, each costing a file
descriptor and a task (slowloris). ``RequestTimeoutProtocol`` gives every request a deadline from its first byte
(from the accept, for a connection's first request) until uvicorn has read it whole; past it the client gets a
408 with ``Connection: close`` (when no response has started) and the connection is closed. Once the request is
read the deadline is gone, so long generations and streams are never cut.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_LIMIT_CONCURRENCY = 512
_READ_WHOLE = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)


def _timeout_response(seconds: float) -> bytes:
    body = json.dumps({"error": {
        "message": f"the request was not received whole within {seconds:g} s (--request-body-timeout)",
        "type": "invalid_request_error", "param": None, "code": "request_timeout"}}).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode()
    return head + body


class RequestTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline on reading each request (``request_timeout`` seconds)."""

    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()  # a connection that never sends a byte is an incomplete request too

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request on a kept-alive connection starts now
        super().data_received(data)
        self._disarm_if_read()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn's keep-alive timer now guards the idle connection; a pipelined request already begun is ours.
        if self.conn.their_state is h11.SEND_BODY and self._deadline is None:
            self._arm()
        self._disarm_if_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _disarm_if_read(self) -> None:
        if self.conn.their_state in _READ_WHOLE:
            self._disarm()

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state in _READ_WHOLE:
            return
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            # Written raw: h11 refuses a response before it has parsed a request, and a half-sent request
            # leaves it mid-message; the connection is closed right after, so its state no longer matters.
            self.transport.write(_timeout_response(self.request_timeout))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the route waiting for the body sees a disconnect and lets go
            cycle.message_event.set()
        self.transport.close()


@dataclass(slots=True)
class ConnectionLimits:
    """What a client may hold: ``request_timeout`` seconds to send a request whole, ``limit_concurrency``
    connections plus requests in flight before uvicorn answers 503 (None: no cap), idle keep-alive seconds."""

    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    limit_concurrency: int | None = DEFAULT_LIMIT_CONCURRENCY
    keep_alive: int = 5

    def validate(self) -> None:
        from cinq.errors import InvalidParameterError
        if not self.request_timeout > 0:
            raise InvalidParameterError(f"request_body_timeout must be > 0 seconds, got {self.request_timeout}",
                                        "request_body_timeout")
        if self.limit_concurrency is not None and self.limit_concurrency < 2:
            # uvicorn counts the new connection itself: 1 would refuse every request
            raise InvalidParameterError(f"limit_concurrency must be >= 2, got {self.limit_concurrency}",
                                        "limit_concurrency")


def uvicorn_config(app: object, limits: ConnectionLimits, log_level: str = "warning",
                   graceful_shutdown: int = 5) -> uvicorn.Config:
    """The uvicorn configuration of a cinq server: h11 with request deadlines (httptools, if installed, would
    bypass them), the concurrency cap and a bounded graceful shutdown."""
    limits.validate()
    protocol = type("RequestTimeoutProtocol", (RequestTimeoutProtocol,), {"request_timeout": limits.request_timeout})
    return uvicorn.Config(app, http=protocol, log_level=log_level, limit_concurrency=limits.limit_concurrency,
                          timeout_keep_alive=limits.keep_alive, timeout_graceful_shutdown=graceful_shutdown)
