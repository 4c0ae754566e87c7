"""AsyncMPLLM: the server's front end with the engine core in its own process (vLLM v1's ``AsyncLLM`` over an
``AsyncMPClient``).

This process keeps what touches text: validation and the fan-out of ``n`` (``InputProcessor``), detokenization,
stop strings and the n-way parents (``OutputProcessor``), and one asyncio queue per request (``RequestStream``, as
``AsyncLLM``'s). The core process (``engine/core_proc.py``) runs the steps. A reader thread receives each step's
``EngineCoreOutputs`` and hands them to the event loop, where they are processed and delivered; a stop string found
here, or a request's own failure, goes back to the core as an abort.

Guarantees (those of ``AsyncLLM``, plus the process's own):
- a validation error reaches the caller of ``add_request`` / ``generate`` as the same ``CinqError``, before
  anything is sent to the core;
- an abort (``abort``, or a consumer that leaves) is sent at once; the core applies it before its next step;
- one request's failure (in the core's update of it, or here while detokenizing it) fails that request alone
  with ``RequestFailedError``; a failed step fails the requests the core held and the core goes on;
- the core process dying (killed, crashed) fails every open request with ``EngineDeadError`` naming how it died,
  ``is_running`` turns False (``/health`` answers 503) and new requests are refused the same way: nothing hangs;
- past ``max_waiting_requests`` waiting sequences new requests get ``EngineOverloadedError``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from cinq.config import EngineConfig
from cinq.engine.async_frontend import AsyncFrontend, call_on_loop
from cinq.engine.async_engine import (EngineDeadError, EngineOverloadedError, RequestFailedError, RequestStream,
                                      check_max_waiting)
from cinq.engine.core_client import CoreDiedError, CoreProcClient
from cinq.engine.input_processor import InputProcessor
from cinq.engine.io import EngineCoreOutputs
from cinq.engine.output_processor import OutputProcessor
from cinq.errors import InvalidParameterError
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import EngineStats
from cinq.sampling_params import OutputKind, SamplingParams

log = logging.getLogger(__name__)


class AsyncMPLLM(AsyncFrontend):
    """``EngineClient`` over an engine core process (see the module docstring). Construction starts the core and
    waits until it has loaded the model (its start-up error, if any, is raised here as itself)."""

    def __init__(self, config: EngineConfig, max_waiting_requests: int | None = None,
                 on_core_start: Callable[..., None] | None = None) -> None:
        super().__init__()
        check_max_waiting(max_waiting_requests)
        self.max_waiting_requests = max_waiting_requests
        self.client = CoreProcClient(config, on_start=on_core_start)
        try:
            info = self.client.info
            self.config = config if info.model == config.model else _with_model(config, info.model)
            self.tokenizer = Tokenizer.from_pretrained(self.config.tokenizer or self.config.model,
                                                       info.model_eos_token_ids, self.config.chat_template)
        except BaseException:
            self.client.shutdown()
            raise
        self.info = info
        self.input_processor = InputProcessor(info, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.num_step_failures = 0
        self.dead_error: str | None = None  # why the core is gone, once it is
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self._stats = EngineStats(num_kv_blocks=info.num_blocks)
        self._stats_time = time.time()
        self._sent = 0  # sequences sent to the core; minus the core's num_added: in flight to it
        self._core_added = 0

    @classmethod
    def from_config(cls, config: EngineConfig, max_waiting_requests: int | None = None) -> AsyncMPLLM:
        return cls(config, max_waiting_requests)

    # ---- what the server reads ----------------------------------------------------------------------------------
    @property
    def core_pid(self) -> int | None:
        """The engine core's process id (the tests kill it; the benchmark reads its CPU time)."""
        return self.client.pid

    # ---- life cycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start receiving the core's outputs; call from inside the event loop that will consume them."""
        if self._reader is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._reader = threading.Thread(target=self._read, name="cinq-core-reader", daemon=True)
        self._reader.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the reader, then the core process (waiting up to ``timeout`` s for it), and fail every request
        still waiting for output. Blocks: on the event loop use ``shutdown_async``."""
        reader = self._signal_stop()
        if reader is not None:
            reader.join(timeout)
        self.client.shutdown(timeout)

    async def shutdown_async(self, timeout: float = 10.0) -> None:
        """``shutdown()`` for the event loop: the waiting happens in a worker thread."""
        reader = self._signal_stop()
        if reader is not None:
            await asyncio.to_thread(reader.join, timeout)
        await asyncio.to_thread(self.client.shutdown, timeout)

    def _signal_stop(self) -> threading.Thread | None:
        self._stopping = True
        reader, self._reader = self._reader, None
        self._fail_all(EngineDeadError("the engine was shut down"))
        return reader

    @property
    def is_running(self) -> bool:
        return (self._reader is not None and self._reader.is_alive() and not self._stopping
                and self.dead_error is None)

    # ---- requests -----------------------------------------------------------------------------------------------
    async def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                          prompt_text: str | None = None, arrival_time: float | None = None,
                          language: str | None = None) -> RequestStream:
        """Validate and send a request; raises its validation error (a ``CinqError``), ``EngineOverloadedError``
        or ``EngineDeadError`` instead. Iterate the returned stream for the outputs."""
        if not self.is_running:
            raise EngineDeadError(f"the engine core {self.dead_error}" if self.dead_error
                                  else "the engine loop is not running")
        if request_id in self._queues or request_id in self.output_processor.parents:
            raise InvalidParameterError(f"request_id {request_id!r} is already in use", "request_id")
        limit, waiting = self.max_waiting_requests, self.num_waiting
        if limit is not None and waiting and waiting + params.n > limit:
            raise EngineOverloadedError(
                f"the server is overloaded: {waiting} sequences are already waiting and this request adds "
                f"{params.n} (limit {limit}); retry later", retry_after=1)
        req = self.input_processor.process(request_id, prompt, params, arrival_time, prompt_text, language)
        self.output_processor.add_request(request_id, req.prompt_text, req.prompt_token_ids, req.params,
                                          req.child_ids, req.arrival_time, req.language)
        try:
            self.client.add(req.core_requests)
        except CoreDiedError as e:  # died a moment ago: the reader reports it to everyone else
            self.output_processor.abort(request_id)
            raise EngineDeadError(str(e)) from None
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        self._sent += len(req.core_requests)
        return RequestStream(request_id, queue, self, params.output_kind is OutputKind.DELTA)

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op when it already finished); the core frees its blocks before its next step."""
        if self._queues.pop(request_id, None) is None:
            return
        children = self.output_processor.child_ids(request_id)
        self.output_processor.abort(request_id)
        if self.dead_error is None and not self._stopping:
            self.client.abort(children, "abort")

    @property
    def num_waiting(self) -> int:
        """Sequences not yet running: sent but not yet taken in by the core, plus the core's waiting queue."""
        return max(0, self._sent - self._core_added) + self._stats.num_waiting

    def get_stats(self) -> EngineStats:
        """The core's stats as of its last message (it publishes after every step and when idle)."""
        return self._stats

    @property
    def stats_time(self) -> float:
        return self._stats_time

    # ---- outputs ------------------------------------------------------------------------------------------------
    def _read(self) -> None:
        """The reader thread: receive and decode off the event loop; a dead core is reported once."""
        while not self._stopping:
            try:
                outputs = self.client.recv()
            except CoreDiedError as e:
                self._to_loop(self._core_died, str(e))
                return
            except Exception as e:  # a socket closed under us at shutdown, or a malformed message
                if not self._stopping:
                    log.exception("reading the engine core's outputs failed")
                    self._to_loop(self._core_died, f"could not be read ({type(e).__name__}: {e})")
                return
            if outputs is not None:
                self._to_loop(self._on_outputs, outputs)

    def _on_outputs(self, step: EngineCoreOutputs) -> None:
        if step.stats is not None:
            self._stats, self._stats_time, self._core_added = step.stats, step.timestamp, step.num_added
        processor = self.output_processor
        if step.step_error is not None:
            self.num_step_failures += 1
            self._fail_children(step.failed_request_ids,
                                RequestFailedError(f"internal engine error: {step.step_error}"))
        # Outputs of requests this side already ended (aborted, stopped on a string) may still arrive: the core
        # learns of the end one step later. They are dropped.
        known = [o for o in step.outputs if o.request_id in processor.children]
        first = [rid for rid in step.first_scheduled_ids if rid in processor.children]
        if not known and not first:
            return
        outputs, stopped, failures = processor.process(known, first)
        self.client.abort(stopped, "stop")
        for failure in failures:
            self.client.abort(failure.child_ids, "error")
            log.error("request %s failed inside the engine and was ended alone: %s", failure.request_id,
                      failure.error)
            queue = self._queues.pop(failure.request_id, None)
            if queue is not None:
                queue.put_nowait(RequestFailedError(f"request {failure.request_id} failed in the engine: "
                                                    f"{failure.error}"))
        self._deliver(outputs)  # a failed request's queue is already gone: its outputs are skipped

    def _fail_children(self, child_ids: list[str], error: BaseException) -> None:
        parents = {self.output_processor.children[c][0].request_id for c in child_ids
                   if c in self.output_processor.children}
        for rid in parents:
            self.output_processor.abort(rid)
            queue = self._queues.pop(rid, None)
            if queue is not None:
                queue.put_nowait(error)

    def _core_died(self, reason: str) -> None:
        if self._stopping:
            return
        self.dead_error = reason.removeprefix("the engine core ")
        log.error("%s; failing the %d open request(s)", reason, len(self._queues))
        self._fail_all(EngineDeadError(f"{reason}; the request was not completed"))

    def _fail_all(self, error: BaseException) -> None:
        for rid in list(self._queues):
            self._queues.pop(rid).put_nowait(error)
            self.output_processor.abort(rid)

    def _to_loop(self, fn: Callable, *args: object) -> None:
        call_on_loop(self._loop, fn, *args)


def _with_model(config: EngineConfig, model: str) -> EngineConfig:
    import dataclasses
    return dataclasses.replace(config, model=model)
