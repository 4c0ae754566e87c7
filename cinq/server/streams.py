"""Plumbing between engine streams and HTTP: merge several requests' outputs into one ordered flow, format
server-sent events, and abort a non-streaming request whose client has gone away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from cinq.engine.async_engine import RequestStream
from cinq.outputs import RequestOutput

T = TypeVar("T")
DONE = "data: [DONE]\n\n"


class ClientDisconnected(Exception):
    """The HTTP client closed the connection before the response was ready."""


class SSEResponse(StreamingResponse):
    """A server-sent-events response that aborts its engine requests however it ends — including when the client
    disconnects before the first chunk, when the body generator never even starts."""

    def __init__(self, content: AsyncIterator[str], streams: list[RequestStream],
                 release: Callable[[list[RequestStream]], None] | None = None) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.streams = streams
        self.release = release  # ServerContext.release: aborts and drops per-request state

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[override]
        try:
            await super().__call__(scope, receive, send)
        finally:
            for s in self.streams:
                s.abort()
            if self.release is not None:
                self.release(self.streams)


def sse(payload: dict) -> str:
    """One server-sent event carrying a JSON object (the OpenAI streaming framing)."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yield ``(stream index, output)`` as outputs arrive from any stream, until all have finished. An error in
    one stream is raised here; on any exit (including the consumer's cancellation) every unfinished stream is
    aborted so the engine frees its blocks."""
    if len(streams) == 1:  # the common case needs no tasks
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            streams[0].abort()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
        except Exception as e:
            queue.put_nowait((i, e))
        queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()


async def final_outputs(streams: list[RequestStream]) -> list[RequestOutput]:
    """The last (finished) output of each stream, in stream order."""
    results: list[RequestOutput | None] = [None] * len(streams)
    async for i, out in merge_streams(streams):
        results[i] = out
    return [r for r in results if r is not None]


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, but cancel it (aborting its requests) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
    raise ClientDisconnected()


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
