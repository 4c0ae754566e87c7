"""DPRequestStream: one request's outputs, in order, whichever replica serves it; where a replica's death is
turned into a re-send (nothing streamed yet) or a ``ReplicaFailedError`` (it had)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from cinq.dp.counters import DPCounters
from cinq.dp.ray_calls import next_item, replica_death_errors, unwrap
from cinq.dp.replica import ReplicaSnapshot
from cinq.engine.async_engine import RequestFailedError
from cinq.outputs import RequestOutput
from cinq.sampling_params import OutputKind, SamplingParams

log = logging.getLogger(__name__)


class ReplicaFailedError(RequestFailedError):
    """The replica serving this request died after the request had started streaming."""


@dataclass(slots=True)
class ReplicaSlot:
    """One replica as the front end tracks it (its actor is replaced on restart, the slot stays)."""

    index: int
    handle: Any  # the Ray actor handle
    generation: int = 0  # bumped on every restart: a stream knows which incarnation it was sent to
    alive: bool = True
    in_flight: int = 0  # this front end's unfinished requests on it: the router's load signal
    snapshot: ReplicaSnapshot | None = None


@dataclass(slots=True)
class DPRequest:
    """A request as sent to a replica (kept to re-send it)."""

    request_id: str
    prompt: str | list[int]
    token_ids: list[int]
    params: SamplingParams
    prompt_text: str | None
    arrival_time: float
    language: str | None


class StreamHost(Protocol):
    """What a stream needs of its front end (``DPAsyncLLM``)."""

    counters: DPCounters

    @property
    def stopping(self) -> bool: ...

    async def send(self, req: DPRequest, exclude: set[int]) -> tuple[ReplicaSlot, int, Any]: ...

    def replica_died(self, replica: ReplicaSlot, generation: int) -> None: ...

    def request_finished(self, out: RequestOutput) -> None: ...


class DPRequestStream:
    """The outputs of one request, in order, whichever replica serves it (``RequestStream``'s interface). A
    consumer that stops early must call ``abort()``."""

    __slots__ = ("request_id", "delta", "finished", "replica", "_llm", "_req", "_generation", "_gen",
                 "_delivered", "_exclude")

    def __init__(self, llm: StreamHost, req: DPRequest) -> None:
        self.request_id = req.request_id
        self.delta = req.params.output_kind is OutputKind.DELTA
        self.finished = False
        self.replica: ReplicaSlot | None = None  # the replica serving it now
        self._llm, self._req = llm, req
        self._generation = 0
        self._gen: Any = None
        self._delivered = False  # an output reached the consumer: past this point a replica death is an error
        self._exclude: set[int] = set()

    async def submit(self) -> None:
        self.replica, self._generation, self._gen = await self._llm.send(self._req, self._exclude)

    def __aiter__(self) -> DPRequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        while True:
            replica = self.replica
            try:
                out = await next_item(self._gen)
            except StopAsyncIteration:  # the replica ended the stream without a finished output (aborted there)
                self._end(failed=True)
                raise RequestFailedError(f"replica {replica.index} ended request {self.request_id} early") from None
            except replica_death_errors():
                self._llm.replica_died(replica, self._generation)
                replica.in_flight -= 1
                self.replica = None
                if self._delivered or self._llm.stopping:
                    self._end(failed=True)
                    raise ReplicaFailedError(
                        f"data-parallel replica {replica.index} died while streaming request {self.request_id}; "
                        f"the output so far is incomplete") from None
                self._llm.counters.retried += 1
                self._exclude.add(replica.index)
                try:
                    await self.submit()
                except asyncio.CancelledError:
                    self.abort()
                    raise
                except BaseException:
                    self._end(failed=True)
                    raise
                continue
            except asyncio.CancelledError:
                self.abort()
                raise
            except BaseException as e:  # the replica's own error for this request
                self._end(failed=True)
                raise unwrap(e) from None
            self._delivered = True
            if out.finished:
                self._end()
                self._llm.request_finished(out)
            return out

    def abort(self) -> None:
        """Abort the request unless it already finished (idempotent)."""
        if not self.finished:
            replica = self.replica
            self._end()
            self._llm.counters.aborted += 1
            if replica is not None:
                abort_on(replica, self.request_id)

    def _end(self, failed: bool = False) -> None:
        self.finished = True
        if self.replica is not None:
            self.replica.in_flight -= 1
            self.replica = None
        if failed:
            self._llm.counters.failed += 1


def abort_on(replica: ReplicaSlot, request_id: str) -> None:
    """Tell a replica to drop a request (fire and forget)."""
    try:
        replica.handle.abort.remote(request_id)  # fire and forget: a dead replica has nothing left to free
    except Exception:
        log.debug("abort of %s on replica %d not sent", request_id, replica.index)
