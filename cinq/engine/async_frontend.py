"""AsyncFrontend: what every ``EngineClient`` front end shares (``AsyncLLM``, ``AsyncMPLLM``, ``DPAsyncLLM``): the
limits the engine reported at start-up, ``generate()`` over ``add_request()``, the finished-request callbacks, and
the delivery of outputs to per-request queues (the single-engine front ends'; the data-parallel one streams from
its replicas instead)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol

from cinq.outputs import RequestOutput
from cinq.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineLimits(Protocol):
    """What a front end learned of its engine at start-up (``EngineCoreInfo``, the data-parallel ``ReplicaInfo``)."""

    max_model_len: int
    vocab_size: int
    num_blocks: int
    architecture: str
    default_sampling_params: dict[str, Any]


class AsyncFrontend:
    """The shared half of the ``EngineClient`` front ends (see the module docstring). A subclass sets ``info``
    and implements ``add_request`` (returning a stream that ends after the finished output) and ``abort``."""

    info: EngineLimits
    dead_error: str | None = None  # why the engine is gone (None while it runs, or when it was merely shut down)

    def __init__(self) -> None:
        # Hooks called on the event loop with every finished RequestOutput (metrics).
        self.finished_callbacks: list[Callable[[RequestOutput], None]] = []
        self._queues: dict[str, asyncio.Queue] = {}  # request id -> its outputs (event-loop side only)

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    def num_blocks(self) -> int:
        return self.info.num_blocks

    @property
    def architecture(self) -> str:
        return self.info.architecture

    @property
    def default_sampling_params(self) -> dict[str, Any]:
        return self.info.default_sampling_params

    async def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                          prompt_text: str | None = None, arrival_time: float | None = None,
                          language: str | None = None) -> Any:
        raise NotImplementedError

    async def generate(self, prompt: str | list[int], params: SamplingParams, request_id: str,
                       prompt_text: str | None = None, arrival_time: float | None = None,
                       language: str | None = None) -> AsyncGenerator[RequestOutput, None]:
        """Add a request and yield its outputs until it finishes. Leaving the loop early (break, cancellation,
        ``aclose()``) aborts the request."""
        stream = await self.add_request(request_id, prompt, params, prompt_text, arrival_time, language)
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()

    def _request_finished(self, out: RequestOutput) -> None:
        for callback in self.finished_callbacks:
            try:
                callback(out)
            except Exception:  # a metrics bug must not lose the output
                log.exception("finished-request callback failed")

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand outputs to their requests' queues (on the event loop); a request already ended here is skipped."""
        for out in outputs:
            queue = self._queues.get(out.request_id)
            if queue is None:
                continue  # aborted on this side after the engine produced it
            queue.put_nowait(out)
            if out.finished:
                del self._queues[out.request_id]
                self._request_finished(out)


def call_on_loop(loop: asyncio.AbstractEventLoop | None, fn: Callable[..., object], *args: object) -> None:
    """Run ``fn(*args)`` on ``loop`` from another thread; dropped when the loop is closed (nobody is left to
    receive it)."""
    try:
        loop.call_soon_threadsafe(fn, *args)  # type: ignore[union-attr]
    except RuntimeError:
        pass
