"""AsyncLLM: the engine behind the server.

``LLMEngine`` is synchronous and not thread-safe, and ``step()`` is blocking CPU/GPU work, so it cannot run on
the server's event loop. AsyncLLM gives it one dedicated thread: the event loop only appends add/abort commands
to a queue; the engine thread drains that queue between steps (the only place that touches the engine), sleeps
on an event when there is nothing to do, and hands each step's outputs back to the event loop, where they land
in one asyncio queue per request.

Guarantees the server relies on:
- a validation error from ``LLMEngine.add_request`` reaches the caller of ``generate`` as the same exception
  (a ``cinq.errors.CinqError``), before any output;
- an abort (``abort`` or a consumer that stops iterating / is cancelled) reaches the engine before its next step,
  so the request's KV blocks are freed within one step;
- an exception in one request's own processing (``LLMEngine.step`` isolates it) fails that request alone with
  ``RequestFailedError`` on its stream; the others in the step go on;
- an unexpected exception in a whole step is logged and fails only the requests in flight at that moment
  (``RequestFailedError``); the loop keeps going and serves later requests;
- the engine thread never holds its command lock while working on a command (tokenizing, validating), so the
  event loop, which takes that lock to queue commands, never waits on it;
- ``shutdown_async()`` stops the engine thread without blocking the event loop; ``shutdown()`` called on the
  event loop only signals the thread (it stops after its current step) instead of joining it;
- the number of waiting requests is bounded: past ``max_waiting_requests`` new requests are refused with
  ``EngineOverloadedError`` instead of queueing without limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cinq.config import EngineConfig
from cinq.engine.async_frontend import AsyncFrontend, call_on_loop
from cinq.engine.engine import LLMEngine
from cinq.errors import CinqError, InvalidParameterError
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import CompletionOutput, EngineStats, RequestOutput
from cinq.sampling_params import OutputKind, SamplingParams

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5  # the idle thread still wakes now and then to publish fresh stats


class EngineOverloadedError(RuntimeError):
    """Too many requests are already waiting; the caller should retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestFailedError(RuntimeError):
    """The engine hit an internal error while this request was in flight; the request was dropped."""


class EngineDeadError(RuntimeError):
    """The engine loop is not running (shut down, or never started)."""


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    arrival_time: float
    prompt_text: str | None
    future: asyncio.Future
    language: str | None = None


@dataclass(slots=True)
class _Abort:
    request_id: str


def check_max_waiting(max_waiting_requests: int | None) -> None:
    """The waiting bound must be >= 1 (or None: no bound)."""
    if max_waiting_requests is not None and max_waiting_requests < 1:
        raise InvalidParameterError(
            f"max_waiting_requests must be >= 1 or None, got {max_waiting_requests}", "max_waiting_requests")


class AsyncLLM(AsyncFrontend):
    """Async front of one ``LLMEngine`` in this process (the engine core in a thread): ``generate()`` yields a
    request's outputs as the engine produces them. An ``EngineClient``; ``AsyncMPLLM`` is the same with the core
    in its own process. An in-process core dies with the process: ``dead_error`` is never set."""

    def __init__(self, engine: LLMEngine, max_waiting_requests: int | None = None) -> None:
        super().__init__()
        check_max_waiting(max_waiting_requests)
        self.engine = engine
        # What the server reads (EngineClient): the engine's own, fixed once it has loaded.
        self.config: EngineConfig = engine.config
        self.tokenizer: Tokenizer = engine.tokenizer
        self.info = engine.info
        self.max_waiting_requests = max_waiting_requests
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped_thread: threading.Thread | None = None  # shut down, possibly still ending its last step
        self._lock = threading.Lock()  # guards _commands, _pending_adds, _num_waiting; held only briefly
        self._wake = threading.Event()
        self._commands: deque[_Add | _Abort] = deque()
        self._pending_adds = 0  # sequences queued as commands, not yet in the engine
        self._num_waiting = 0  # sequences in the engine's waiting queue (as of the last drain or step)
        self._live: set[str] = set()  # engine-thread side only: requests the engine holds
        self._stopping = False
        self._stats = engine.get_stats()
        self._stats_time = time.time()
        self.num_step_failures = 0

    @classmethod
    def from_config(cls, config: EngineConfig, max_waiting_requests: int | None = None) -> AsyncLLM:
        return cls(LLMEngine(config), max_waiting_requests)

    # ---- life cycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread; call from inside the event loop that will consume the outputs."""
        if self._thread is not None:
            return
        if self._stopped_thread is not None:  # a shut-down thread finishing its last step must not overlap
            self._stopped_thread.join()
            self._stopped_thread = None
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="cinq-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (after its current step) and fail every request still waiting for output.

        From any thread but the event loop's it waits up to ``timeout`` s for the thread to end. On the event
        loop it does not wait (a step may take long and the loop must keep serving): the thread ends by itself
        after its current step; ``await shutdown_async()`` to wait for it there."""
        thread = self._signal_stop()
        if thread is not None and not self._on_loop():
            thread.join(timeout)

    async def shutdown_async(self, timeout: float = 10.0) -> None:
        """``shutdown()`` for the event loop: waits for the engine thread in a worker thread, not on the loop."""
        thread = self._signal_stop()
        if thread is not None:
            await asyncio.to_thread(thread.join, timeout)

    def _signal_stop(self) -> threading.Thread | None:
        self._stopping = True
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self._stopped_thread = thread
        for rid in list(self._queues):
            self._queues.pop(rid).put_nowait(EngineDeadError("the engine was shut down"))
        return thread

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    # ---- the event-loop side ------------------------------------------------------------------------------------
    async def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                          prompt_text: str | None = None, arrival_time: float | None = None,
                          language: str | None = None) -> RequestStream:
        """Queue a request and wait until the engine accepted it; raises its validation error (a
        ``CinqError``) or ``EngineOverloadedError`` instead. Iterate the returned stream for the outputs.
        ``language``: the tag of its speculative-decoding counters (``LLMEngine.add_request``)."""
        queue = await self._add(request_id, prompt, params, prompt_text, arrival_time or time.time(), language)
        return RequestStream(request_id, queue, self, params.output_kind is OutputKind.DELTA)

    async def _add(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                   prompt_text: str | None, arrival_time: float, language: str | None = None) -> asyncio.Queue:
        if not self.is_running:
            raise EngineDeadError("the engine loop is not running")
        if request_id in self._queues:
            raise InvalidParameterError(f"request_id {request_id!r} is already in use", "request_id")
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            limit = self.max_waiting_requests
            current = self._pending_adds + self._num_waiting
            # The new request's n sequences count; one larger than the bound still runs when nothing waits.
            if limit is not None and current and current + params.n > limit:
                raise EngineOverloadedError(
                    f"the server is overloaded: {current} sequences are already waiting and this request adds "
                    f"{params.n} (limit {limit}); retry later", retry_after=1)
            self._pending_adds += params.n
            self._queues[request_id] = queue
            self._commands.append(_Add(request_id, prompt, params, arrival_time, prompt_text, future, language))
        self._wake.set()
        try:
            await future
        except asyncio.CancelledError:
            self.abort(request_id)  # the add is queued before the abort, so the engine drops it again
            raise
        except BaseException:
            self._queues.pop(request_id, None)
            raise
        return queue

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op when it already finished); its blocks are freed before the next step."""
        if self._queues.pop(request_id, None) is None:
            return
        with self._lock:
            self._commands.append(_Abort(request_id))
        self._wake.set()

    @property
    def num_waiting(self) -> int:
        """Sequences not yet running: queued for the engine thread plus in the engine's waiting queue (the number
        ``max_waiting_requests`` bounds)."""
        with self._lock:
            return self._pending_adds + self._num_waiting

    def get_stats(self) -> EngineStats:
        """The engine's stats as of its last step (or idle tick): safe to read from any thread."""
        return self._stats

    @property
    def stats_time(self) -> float:
        return self._stats_time

    def _fail(self, request_ids: list[str], error: BaseException) -> None:
        for rid in request_ids:
            queue = self._queues.pop(rid, None)
            if queue is not None:
                queue.put_nowait(error)

    def _to_loop(self, fn: Callable, *args: object) -> None:
        call_on_loop(self._loop, fn, *args)

    # ---- the engine thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            try:
                self._iteration()
            except Exception as e:  # nothing may end the loop: fail what was in flight and go on
                self.num_step_failures += 1
                log.exception("engine step failed; failing the %d request(s) in flight", len(self._live))
                self._fail_live(e)
                self._publish_stats()

    def _iteration(self) -> None:
        engine = self.engine
        self._drain()
        if not engine.has_unfinished_requests():
            self._publish_stats()
            self._wake.wait(_IDLE_WAIT_S)
            self._wake.clear()
            return
        outputs = engine.step()
        for out in outputs:
            if out.finished:
                self._live.discard(out.request_id)
        failed = engine.failed_requests
        if failed:  # the engine ended these alone: their streams get the error, not an "error" output
            outputs = [o for o in outputs if o.request_id not in failed]
        if outputs:
            self._to_loop(self._deliver, outputs)
        if failed:
            for rid, error in failed.items():
                self._to_loop(self._fail, [rid], RequestFailedError(f"request {rid} failed in the engine: {error}"))
        self._publish_stats()

    def _drain(self) -> None:
        # Take the commands under the lock, apply them outside it: an add tokenizes and validates, which can
        # take a while for a long prompt, and the event loop takes the same lock to queue the next command.
        with self._lock:
            commands = list(self._commands)
            self._commands.clear()
        for cmd in commands:
            if isinstance(cmd, _Add):
                self._apply_add(cmd)
                # Moved from "pending" to the engine's queue in one go, so the waiting bound never undercounts.
                with self._lock:
                    self._pending_adds -= cmd.params.n
                    self._num_waiting = self.engine.num_waiting
            else:
                self._apply_abort(cmd.request_id)

    def _apply_add(self, cmd: _Add) -> None:
        error: BaseException | None = None
        try:
            self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params, cmd.arrival_time, cmd.prompt_text,
                                    cmd.language)
            self._live.add(cmd.request_id)
        except CinqError as e:
            error = e
        except Exception as e:  # an engine bug on this input: report it for this request only
            log.exception("add_request failed for %s", cmd.request_id)
            error = RequestFailedError(f"the engine could not add the request: {e}")
            self._safe_abort(cmd.request_id)
        self._to_loop(_resolve, cmd.future, error)

    def _apply_abort(self, request_id: str) -> None:
        if request_id in self._live:
            self._live.discard(request_id)
            self._safe_abort(request_id)

    def _safe_abort(self, request_id: str) -> None:
        try:
            self.engine.abort_request(request_id)
        except Exception:
            log.exception("abort_request failed for %s", request_id)

    def _fail_live(self, error: Exception) -> None:
        failed = sorted(self._live)
        for rid in failed:
            self._safe_abort(rid)
        self._live.clear()
        self._to_loop(self._fail, failed, RequestFailedError(f"internal engine error: {type(error).__name__}: "
                                                             f"{error}"))

    def _publish_stats(self) -> None:
        try:
            stats = self.engine.get_stats()
        except Exception:
            log.exception("get_stats failed")
            return
        stats = dataclasses.replace(stats, finished_by_reason=dict(stats.finished_by_reason))
        with self._lock:
            self._num_waiting = stats.num_waiting
        self._stats, self._stats_time = stats, time.time()


class RequestStream:
    """The outputs of one request, in order; ends after the finished output. A consumer that stops early must
    call ``abort()`` (``AsyncLLM.generate`` does) so the engine frees the request's blocks."""

    __slots__ = ("request_id", "delta", "finished", "_queue", "_llm")

    def __init__(self, request_id: str, queue: asyncio.Queue, llm: AsyncLLM, delta: bool = False) -> None:
        self.request_id = request_id
        self.delta = delta  # outputs are deltas (OutputKind.DELTA), merged by concatenation
        self.finished = False
        self._queue = queue
        self._llm = llm

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        # A consumer that fell behind gets what piled up as one output (fewer, larger chunks under load).
        while not isinstance(item, BaseException) and not self._queue.empty():
            nxt = self._queue.get_nowait()
            item = nxt if isinstance(nxt, BaseException) else _merge(item, nxt, self.delta)
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def abort(self) -> None:
        """Abort the request unless it already finished (idempotent)."""
        if not self.finished:
            self.finished = True
            self._llm.abort(self.request_id)


def _merge(old: RequestOutput, new: RequestOutput, delta: bool) -> RequestOutput:
    """Fold two successive outputs of one request into one. Delta outputs (``new`` carries only what changed)
    are concatenated per completion index; cumulative and final outputs simply supersede."""
    if not delta:
        return new
    by_index = {c.index: c for c in old.outputs}
    for c in new.outputs:
        prev = by_index.get(c.index)
        if prev is None:
            by_index[c.index] = c
            continue
        logprobs = None if prev.logprobs is None and c.logprobs is None else (prev.logprobs or []) + (c.logprobs or [])
        by_index[c.index] = CompletionOutput(c.index, prev.text + c.text, prev.token_ids + c.token_ids,
                                             c.cumulative_logprob, logprobs, c.finish_reason, c.stop_reason)
    return dataclasses.replace(new, outputs=[by_index[i] for i in sorted(by_index)],
                               prompt_logprobs=old.prompt_logprobs if old.prompt_logprobs is not None
                               else new.prompt_logprobs)


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():  # the adder was cancelled
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
