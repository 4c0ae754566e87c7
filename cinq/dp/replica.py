"""One data-parallel replica: a whole engine (an ``AsyncLLM`` built from an ``EngineConfig``, whatever its
parallel layout) inside a Ray actor.

The class is plain Python; ``cinq.dp.dp_engine`` wraps it with ``ray.remote`` (Ray is an optional extra, so
nothing here imports it). Ray runs an actor whose methods are coroutines on one event loop in the actor's
process, which is where the ``AsyncLLM`` delivers its outputs. ``generate`` is an async generator that the front
end calls as a Ray streaming generator (``num_returns="streaming"``): its first item is ``ACCEPTED`` once the
engine took the request (or the request's validation error, raised as the task's error), then the request's
``RequestOutput``s in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from cinq.config import EngineConfig
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import EngineStats, RequestOutput
from cinq.sampling_params import SamplingParams

ACCEPTED = "accepted"  # the first item of every replica stream: the engine took the request
_MAX_EARLY_ABORTS = 4096  # aborts remembered for generate calls not yet seen (bounded: one may never come)


@dataclass(slots=True)
class ReplicaInfo:
    """What the front end needs to know of the engines it fronts (the same for every replica)."""

    tokenizer: Tokenizer
    max_model_len: int
    vocab_size: int
    num_blocks: int
    architecture: str
    default_sampling_params: dict[str, Any]


@dataclass(slots=True)
class ReplicaSnapshot:
    """A replica's engine stats as of its last step, for /metrics and the load report."""

    stats: EngineStats
    stats_time: float
    num_step_failures: int


class EngineReplica:
    """The body of a replica actor: one ``EngineClient`` (``AsyncLLM``), and the tasks of the requests it is streaming (so that an
    abort from the front end can stop the stream, which aborts the request in the engine)."""

    def __init__(self, config: EngineConfig, max_waiting_requests: int | None = None) -> None:
        # Loads torch and the model: only inside the actor. The core runs in the actor's process: the actor is
        # already a process of its own, whose event loop only relays outputs.
        from cinq.engine.protocol import make_engine_client
        self.llm = make_engine_client(config, max_waiting_requests, "inproc")
        self._tasks: dict[str, asyncio.Task] = {}
        self._early_aborts: set[str] = set()

    async def ready(self) -> ReplicaInfo:
        """Start the engine loop (on the actor's event loop) and describe the engine."""
        self.llm.start()
        llm = self.llm
        return ReplicaInfo(llm.tokenizer, llm.max_model_len, llm.vocab_size, llm.num_blocks, llm.architecture,
                           dict(llm.default_sampling_params))

    async def generate(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                       prompt_text: str | None, arrival_time: float,
                       language: str | None) -> AsyncGenerator[str | RequestOutput, None]:
        """``ACCEPTED``, then the request's outputs until it finishes. A validation or overload error of
        ``AsyncLLM.add_request`` is raised before anything is yielded."""
        if request_id in self._early_aborts:  # the front end gave up on it before it got here
            self._early_aborts.discard(request_id)
            return
        task = asyncio.current_task()
        if task is not None:  # registered first, so an abort during the add cancels the add too
            self._tasks[request_id] = task
        stream = None
        try:
            stream = await self.llm.add_request(request_id, prompt, params, prompt_text, arrival_time, language)
            yield ACCEPTED
            async for out in stream:
                yield out
        finally:
            if stream is not None:
                stream.abort()  # no-op once finished; frees the engine's blocks when the stream was cut short
            self._tasks.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        """Stop streaming a request; its ``generate`` ends and aborts it in the engine."""
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()
        elif len(self._early_aborts) < _MAX_EARLY_ABORTS:  # the abort overtook its generate call
            self._early_aborts.add(request_id)

    async def snapshot(self) -> ReplicaSnapshot:
        return ReplicaSnapshot(self.llm.get_stats(), self.llm.stats_time, self.llm.num_step_failures)

    async def shutdown(self) -> None:
        await self.llm.shutdown_async()

