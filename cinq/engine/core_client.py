"""CoreProcClient: the front end's side of an engine core in its own process (vLLM's ``MPClient``): it spawns
the process (``engine/core_proc.py``), binds the two ZMQ sockets in a private folder, waits for READY, then sends
requests and aborts and receives ``EngineCoreOutputs``.

Faults are told apart and named: a core that cannot start raises its own error here (a bad model folder is the
``ModelLoadError`` line, not a timeout); a core that dies later (killed, crashed) makes ``recv`` raise
``CoreDiedError`` saying how (signal or exit code) within ``_POLL_MS``; nothing ever waits on a dead process.
``shutdown()`` (and, as a last resort, the finalizer at exit) stops the process and removes the socket folder.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import weakref
from collections.abc import Callable
from multiprocessing.process import BaseProcess

import zmq

from cinq.config import EngineConfig
from cinq.engine.core_proc import run_engine_core
from cinq.engine.io import EngineCoreInfo, EngineCoreOutputs, EngineCoreRequest
from cinq.engine.serial import ABORT, ADD, OUTPUTS, READY, SHUTDOWN, STARTUP_ERROR, CoreAbort, decode, encode
from cinq.engine.serial import error_from_wire

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # loading a big model may take long; a dead core is seen within a poll
_POLL_MS = 100
_CONNECT_WAIT_MS = 1000


class CoreDiedError(RuntimeError):
    """The engine core process is gone (killed, or crashed); ``str()`` says how."""


class CoreProcClient:
    """One engine core process and the sockets to it. Not thread-safe per direction: one thread sends
    (``add`` / ``abort``), one receives (``recv``)."""

    def __init__(self, config: EngineConfig, start_timeout: float = START_TIMEOUT_S,
                 on_start: Callable[..., None] | None = None) -> None:
        self.socket_dir = tempfile.mkdtemp(prefix="cinq-core-")
        input_addr, output_addr = f"ipc://{self.socket_dir}/input", f"ipc://{self.socket_dir}/output"
        self._zctx = zmq.Context()
        self._input = self._zctx.socket(zmq.PUSH)
        self._input.setsockopt(zmq.LINGER, 1000)
        # Sends never block the caller (the server's event loop): no high-water mark, and a send with no core
        # connected (it died a moment ago) fails at once instead of waiting for a peer that will not come.
        self._input.setsockopt(zmq.SNDHWM, 0)
        self._input.bind(input_addr)
        self._output = self._zctx.socket(zmq.PULL)
        self._output.setsockopt(zmq.LINGER, 0)
        self._output.bind(output_addr)
        ctx = multiprocessing.get_context("spawn")  # CUDA and OpenMP state must not be forked
        level = logging.getLogger("cinq").getEffectiveLevel()
        self.proc: BaseProcess = ctx.Process(
            target=run_engine_core, name="cinq-engine-core", daemon=True,
            args=(config, input_addr, output_addr, os.getpid(), self.socket_dir, level, on_start))
        self._closed = False
        self.proc.start()
        # Dropped without shutdown() (an exception, interpreter exit): the process and the folder still go.
        self._finalizer = weakref.finalize(self, _tear_down, self.proc, self.socket_dir)
        try:
            self.info: EngineCoreInfo = self._wait_ready(start_timeout)
        except BaseException:
            self.shutdown(timeout=2.0)
            raise
        log.info("engine core process %d ready (%s, %d KV blocks)", self.proc.pid, self.info.architecture,
                 self.info.num_blocks)

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def _wait_ready(self, timeout: float) -> EngineCoreInfo:
        deadline = time.monotonic() + timeout
        while True:
            if self._output.poll(_POLL_MS):
                kind, body = decode(self._output.recv_multipart())
                if kind == READY:
                    assert isinstance(body, EngineCoreInfo)
                    return body
                if kind == STARTUP_ERROR:
                    raise error_from_wire(body) from None  # type: ignore[arg-type]
                raise RuntimeError(f"the engine core broke the start-up protocol: {kind!r}")
            if not self.proc.is_alive():
                raise CoreDiedError(f"the engine core process {self.death_reason()} during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine core did not start within {timeout:.0f} s")

    def death_reason(self) -> str:
        """How the process ended, in words ("was killed by SIGKILL", "exited with code 1")."""
        code = self.proc.exitcode
        if code is None:
            return "is still running"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def is_alive(self) -> bool:
        return not self._closed and self.proc.is_alive()

    # ---- traffic ----------------------------------------------------------------------------------------------
    def add(self, requests: list[EngineCoreRequest]) -> None:
        """Send one request's sequences (its n children) together; ``CoreDiedError`` when no core is there."""
        self._send(encode(ADD, requests))

    def abort(self, request_ids: list[str], status: str = "abort") -> None:
        """End sequences in the core (``status``: "abort", "stop" or "error"); a gone core needs no abort."""
        if request_ids and not self._closed:
            try:
                self._send(encode(ABORT, CoreAbort(request_ids, status)))
            except CoreDiedError:
                pass

    def _send(self, frames: list[bytes]) -> None:
        if self._closed:
            raise CoreDiedError("the engine core was shut down")
        try:
            self._input.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            return
        except zmq.Again:
            pass
        # No core connected: just starting (its connect is asynchronous) or just died. Wait a moment for the one,
        # fail for the other.
        if self.proc.is_alive() and self._input.poll(_CONNECT_WAIT_MS, zmq.POLLOUT):
            try:
                self._input.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                pass
        raise CoreDiedError(f"the engine core process (pid {self.proc.pid}) is not connected "
                            f"({self.death_reason()})")

    def recv(self, timeout_ms: int = _POLL_MS) -> EngineCoreOutputs | None:
        """The next step's outputs, or None after ``timeout_ms``; ``CoreDiedError`` once the process is gone
        (outputs it sent before dying are still delivered first)."""
        if self._output.poll(timeout_ms):
            kind, body = decode(self._output.recv_multipart(copy=True))
            if kind != OUTPUTS:
                raise RuntimeError(f"the engine core broke the protocol: {kind!r}")
            return body  # type: ignore[return-value]
        if not self.proc.is_alive():
            raise CoreDiedError(f"the engine core process (pid {self.proc.pid}) {self.death_reason()}")
        return None

    # ---- life cycle -------------------------------------------------------------------------------------------
    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the core to stop, wait up to ``timeout`` s, then terminate / kill it; close the sockets and remove
        their folder. Idempotent. The receiving thread must have stopped calling ``recv``."""
        if self._closed:
            return
        self._closed = True
        alive = self.proc.is_alive()
        if alive:
            try:
                self._input.send_multipart(encode(SHUTDOWN), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self._input.close(linger=1000 if alive else 0)  # SHUTDOWN must get out before the socket goes
        self._output.close(linger=0)
        self._zctx.term()
        self._finalizer.detach()
        _stop_process(self.proc, timeout)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def _stop_process(proc: BaseProcess, timeout: float) -> None:
    proc.join(timeout)
    if proc.is_alive():
        log.warning("engine core process %d did not stop within %.0f s; terminating it", proc.pid, timeout)
        proc.terminate()
        proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


def _tear_down(proc: BaseProcess, socket_dir: str) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(2)
    shutil.rmtree(socket_dir, ignore_errors=True)
