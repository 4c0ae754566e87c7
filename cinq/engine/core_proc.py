"""EngineCoreProc: an ``EngineCore`` in its own process behind ZMQ (vLLM v1's ``EngineCoreProc``).

Why: the step loop is Python, and in one process it shares the GIL with the server's event loop, HTTP parsing,
detokenization and SSE; here it has a process (and a GIL) of its own, and the front end only (de)serialises.

Three threads: the input thread receives and decodes messages (``engine/serial.py``) into a queue; the main thread
takes commands between steps and runs the steps; the output thread encodes and sends each step's
``EngineCoreOutputs`` (so encoding overlaps the next step). Sockets: the front end binds both (ipc:// in a folder
of its own), the core connects: input PUSH -> PULL, output PUSH -> PULL.

Life cycle: the core reports READY with its ``EngineCoreInfo`` or, if it cannot start, STARTUP_ERROR with the
original error, then exits. It ignores SIGINT (Ctrl-C reaches the whole process group; the front end decides and
sends SHUTDOWN), ends cleanly on SIGTERM or SHUTDOWN (tensor-parallel workers stopped, sockets closed), and exits
by itself within a second when its front end's process is gone, removing the socket folder the front end could
not. An exception in a step ends the requests it held (``EngineCoreOutputs.step_error``) and the loop goes on, as
the in-process engine thread does.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import shutil
import signal
import threading
import time
from collections.abc import Callable

import zmq

from cinq.config import EngineConfig
from cinq.engine.core import EngineCore
from cinq.engine.io import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from cinq.engine.serial import (ABORT, ADD, OUTPUTS, READY, SHUTDOWN, STARTUP_ERROR, CoreAbort, decode, encode,
                                error_to_wire)
from cinq.step.request import RequestStatus

log = logging.getLogger(__name__)

IDLE_STATS_S = 0.5  # an idle core still publishes its stats this often
_POLL_MS = 200  # how often the input thread looks up from its socket (parent alive? stopping?)


class _Shutdown(Exception):
    """SIGTERM: leave the main loop and clean up."""


def run_engine_core(config: EngineConfig, input_addr: str, output_addr: str, parent_pid: int, socket_dir: str,
                    log_level: int = logging.INFO, on_start: Callable[[EngineCore], None] | None = None) -> None:
    """Entry point of the core process (spawned by ``engine/core_client.py``). ``on_start``: a test hook run on
    the built core (a picklable module-level function), e.g. to make a step raise."""
    # Spawned as a daemon so that it can never outlive a front end that exits without stopping it; a daemon may
    # not start processes of its own, and tensor parallelism needs worker processes: this process allows them.
    multiprocessing.current_process().daemon = False
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def on_term(*_: object) -> None:
        raise _Shutdown()

    signal.signal(signal.SIGTERM, on_term)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s [core] %(name)s: %(message)s")
    logging.getLogger("cinq").setLevel(log_level)
    zctx = zmq.Context()
    out = zctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, 5000)  # a start-up error must still get out before the process ends
    out.connect(output_addr)
    core = None
    try:
        core = EngineCore(config)
        if on_start is not None:
            on_start(core)
    except (Exception, _Shutdown) as e:
        if not isinstance(e, _Shutdown):
            out.send_multipart(encode(STARTUP_ERROR, error_to_wire(e)))
        if core is not None:
            core.shutdown()
        out.close()
        zctx.term()
        raise SystemExit(1) from None
    proc = EngineCoreProc(core, zctx, input_addr, out, parent_pid, socket_dir)
    try:
        proc.run()
    except _Shutdown:
        log.info("engine core: SIGTERM, stopping")
    finally:
        proc.close()


class EngineCoreProc:
    """The core's main loop and its input and output threads (see the module docstring)."""

    def __init__(self, core: EngineCore, zctx: zmq.Context, input_addr: str, out: zmq.Socket, parent_pid: int,
                 socket_dir: str) -> None:
        self.core = core
        self._zctx = zctx
        self._out_socket = out
        self._inputs: queue.Queue = queue.Queue()
        self._outputs: queue.Queue = queue.Queue()
        self._stopping = False
        self._num_added = 0
        self._pending: list[EngineCoreOutput] = []  # requests the core could not add: their error outputs
        self._parent_pid = parent_pid
        self._socket_dir = socket_dir
        self._in_thread = threading.Thread(target=self._input_loop, args=(input_addr,), name="cinq-core-input",
                                           daemon=True)
        self._out_thread = threading.Thread(target=self._output_loop, name="cinq-core-output", daemon=True)
        self._in_thread.start()
        self._out_thread.start()
        out.send_multipart(encode(READY, core.info()))

    # ---- threads ----------------------------------------------------------------------------------------------
    def _input_loop(self, input_addr: str) -> None:
        sock = self._zctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(input_addr)
        try:
            while not self._stopping:
                if os.getppid() != self._parent_pid:  # the front end is gone (killed): nobody to serve
                    log.warning("engine core: the front end's process is gone; exiting")
                    shutil.rmtree(self._socket_dir, ignore_errors=True)
                    self._inputs.put((SHUTDOWN, None))
                    return
                if not sock.poll(_POLL_MS):
                    continue
                try:
                    self._inputs.put(decode(sock.recv_multipart(copy=True)))
                except ValueError:
                    log.exception("engine core: dropped a malformed message")
        finally:
            sock.close()

    def _output_loop(self) -> None:
        while True:
            item = self._outputs.get()
            if item is None:
                return
            try:
                self._out_socket.send_multipart(encode(OUTPUTS, item))
            except zmq.ZMQError:  # the context is being torn down
                return

    # ---- the main loop ----------------------------------------------------------------------------------------
    def run(self) -> None:
        last_publish = 0.0
        while not self._stopping:
            busy = self.core.has_unfinished_requests()
            changed = self._drain(block=not busy)
            if self._stopping:
                break
            if self.core.has_unfinished_requests() or self._pending:
                self._step()
                last_publish = time.monotonic()
            elif changed or time.monotonic() - last_publish >= IDLE_STATS_S:
                self._publish(EngineCoreOutputs(timestamp=time.time()))  # fresh stats (an abort freed blocks)
                last_publish = time.monotonic()

    def _drain(self, block: bool) -> bool:
        """Apply the queued commands (waiting up to ``IDLE_STATS_S`` for one when ``block``); True if any."""
        try:
            first = self._inputs.get(timeout=IDLE_STATS_S) if block else self._inputs.get_nowait()
        except queue.Empty:
            return False
        self._apply(*first)
        while not self._stopping:
            try:
                self._apply(*self._inputs.get_nowait())
            except queue.Empty:
                break
        return True

    def _apply(self, kind: bytes, body: object) -> None:
        if kind == ADD:
            for req in body:  # type: ignore[union-attr]
                self._add(req)
        elif kind == ABORT:
            assert isinstance(body, CoreAbort)
            try:
                self.core.abort_requests(body.request_ids, RequestStatus(body.status))
            except Exception:
                log.exception("engine core: abort failed for %s", body.request_ids)
        elif kind == SHUTDOWN:
            self._stopping = True

    def _add(self, req: EngineCoreRequest) -> None:
        self._num_added += 1
        try:
            self.core.add_request(req)
        except Exception as e:  # a core bug on this input: that request alone fails
            log.exception("engine core: add_request failed for %s", req.request_id)
            self._pending.append(EngineCoreOutput(req.request_id, finish_reason="error",
                                                  error=f"the engine could not add the request: "
                                                        f"{type(e).__name__}: {e}"))

    def _step(self) -> None:
        try:
            outputs = self.core.step()
        except Exception as e:  # the batch failed: end what was in flight, keep serving
            log.exception("engine step failed; failing the %d request(s) in flight",
                          len(self.core.scheduler.requests))
            outputs = self.core.fail_all(e)
        if self._pending:
            outputs.outputs = self._pending + outputs.outputs
            self._pending = []
        self._publish(outputs)

    def _publish(self, outputs: EngineCoreOutputs) -> None:
        outputs.stats = self.core.get_stats()
        outputs.num_added = self._num_added
        self._outputs.put(outputs)

    def close(self) -> None:
        """Stop the threads, the executor (tensor-parallel workers) and the sockets."""
        self._stopping = True
        self._outputs.put(None)
        self._out_thread.join(5)
        self._in_thread.join(2)
        try:
            self.core.shutdown()
        except Exception:
            log.exception("engine core: executor shutdown failed")
        self._out_socket.close(linger=1000)
        self._zctx.term()
