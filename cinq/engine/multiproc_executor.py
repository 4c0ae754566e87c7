"""MultiprocExecutor: tensor parallelism over ``tensor_parallel_size`` processes (torch.distributed: gloo on CPU,
NCCL on CUDA).

Rank 0 is this process: it loads its shard in a ``UniProcExecutor``, runs the scheduler (the engine's) and
broadcasts each step's plain ``SchedulerOutput`` to the workers (ranks 1..N-1, spawned with
``torch.multiprocessing``, main loop in cinq/engine/tp_worker.py) before running the step itself; the layers'
collectives keep the ranks in lock step. The KV cache is sharded by heads, so every rank uses the same block
tables and the scheduler needs nothing new. Every rank gathers the same logits and samples the same tokens;
rank 0's ``RunnerOutput`` is the engine's.

Failure is loud and quick, never a hang: a worker that dies during start-up sends its error (or is seen dead)
before the group forms; one that dies later closes its sockets, so the next collective fails at once (a stuck
one after ``COLLECTIVE_TIMEOUT``), and every later call raises ``TensorParallelError`` naming the rank.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cinq.config import EngineConfig
from cinq.distributed.parallel_state import TPShard, broadcast_command, init_process_groups, serve_rendezvous
from cinq.engine.tp_worker import INIT_CACHE, STEP, STOP, WorkerArgs, worker_main
from cinq.engine.uniproc_executor import UniProcExecutor
from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.model.tp_layout import check_divisible
from cinq.step.runner_output import RunnerOutput
from cinq.step.scheduler_output import SchedulerOutput

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_START_TIMEOUT_S = 600.0  # loading a shard may take long; a dead worker is seen within a poll interval
_STOP_TIMEOUT_S = 5.0


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker died or a collective failed: the engine cannot go on."""


class MultiprocExecutor:
    """``tensor_parallel_size`` ranks: rank 0 here, the others in worker processes (see the module docstring)."""

    def __init__(self, config: EngineConfig, seed: int | None = None) -> None:
        world = config.parallel_config.world_size
        check_divisible(ModelConfig.from_pretrained(config.model), world)  # before any process starts
        if dist.is_initialized():
            raise InvalidParameterError(
                f"tensor_parallel_size {world}: this process already belongs to a torch.distributed group (another "
                f"tensor-parallel engine?); shut that engine down first", "tensor_parallel_size")
        self.config = config
        self.seed = seed if seed is not None else config.seed or 0
        self.world_size = world
        self._error: TensorParallelError | None = None
        self._store = serve_rendezvous(world)  # bound before any worker starts: no port race
        ctx = mp.get_context("spawn")  # CUDA and OpenMP state must not be forked
        self._workers: list[BaseProcess] = []
        pipes: list[Connection] = []
        # Torn down when the executor is dropped without shutdown() (or at exit): no orphaned worker.
        self._stopping = {"graceful": False}  # shutdown() lets them exit by themselves first
        self._finalizer = weakref.finalize(self, _tear_down, self._workers, self._stopping)
        try:
            for rank in range(1, world):
                receive, send = ctx.Pipe(duplex=False)
                args = WorkerArgs(config, self.seed, TPShard(rank, world), self._store.port)
                proc = ctx.Process(target=worker_main, args=(args, send), name=f"cinq-tp-rank{rank}", daemon=True)
                proc.start()
                send.close()
                self._workers.append(proc)
                pipes.append(receive)
            self.driver = UniProcExecutor(config, self.seed, TPShard(0, world))
            self._wait_ready(pipes)
            self._control = init_process_groups(self.driver.device.type, TPShard(0, world), self._store)
        except BaseException:
            self._finalizer()
            raise
        self.model_config: ModelConfig = self.driver.model_config
        self.attention_backend: str = self.driver.attention_backend
        self.model = self.driver.model  # rank 0's shard
        log.info("tensor parallel: %d ranks (%s), worker pids %s", world,
                 "nccl" if self.driver.device.type == "cuda" else "gloo", [p.pid for p in self._workers])

    def _wait_ready(self, pipes: list[Connection]) -> None:
        """Wait for every worker to load its shard; a start-up error or death raises, naming the rank."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        waiting = dict(enumerate(pipes, start=1))
        while waiting:
            for rank, pipe in list(waiting.items()):
                if pipe.poll(0.05):
                    try:
                        error = pipe.recv()
                    except EOFError:
                        error = ("it exited before reporting (a script that starts a tensor-parallel engine at "
                                 "import time needs an `if __name__ == \"__main__\":` guard: workers are spawned)")
                    if error is not None:
                        raise TensorParallelError(f"tensor-parallel worker rank {rank} failed to start: {error}")
                    del waiting[rank]
                elif not self._workers[rank - 1].is_alive():
                    raise TensorParallelError(f"tensor-parallel worker rank {rank} died during start-up "
                                              f"(exit code {self._workers[rank - 1].exitcode})")
            if time.monotonic() > deadline:
                raise TensorParallelError(f"tensor-parallel workers {sorted(waiting)} did not load their shard "
                                          f"within {_START_TIMEOUT_S:.0f} s")

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes one KV block takes: one rank's (its heads) per device on CUDA; all ranks' on a CPU, whose
        memory they share."""
        per_rank = self.driver.kv_bytes_per_block(block_size)
        return per_rank * (self.world_size if self.driver.device.type == "cpu" else 1)

    def initialize_cache(self, num_blocks: int | tuple[int, int]) -> None:
        """Every rank allocates ``num_blocks`` blocks of its own KV heads (a pair: per KV cache group)."""
        self._run(INIT_CACHE, num_blocks, lambda: self.driver.initialize_cache(num_blocks))

    def execute_model(self, sched: SchedulerOutput) -> RunnerOutput:
        """Broadcast the step, run it here as rank 0; rank 0's output is the step's."""
        return self._run(STEP, sched, lambda: self.driver.execute_model(sched))

    def _run(self, command: str, arg: object, here: Callable[[], _T]) -> _T:
        """Broadcast ``(command, arg)`` to the workers, then do ``here`` as rank 0."""
        if self._error is not None:
            raise self._error
        self._check_workers()
        try:
            broadcast_command((command, arg), self._control)
            return here()
        except Exception as e:
            # A failed collective (or any error on rank 0 mid-step) leaves the ranks out of step for good.
            self._error = TensorParallelError(self._diagnose(e))
            self._finalizer()
            raise self._error from e

    def _check_workers(self) -> None:
        dead = [(rank, p) for rank, p in enumerate(self._workers, start=1) if not p.is_alive()]
        if dead:
            self._error = TensorParallelError(_describe_dead(dead))
            self._finalizer()
            raise self._error

    def _diagnose(self, error: Exception) -> str:
        """Name the dead worker(s) behind a failed step (a dying process may take a moment to be reaped)."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            dead = [(rank, p) for rank, p in enumerate(self._workers, start=1) if not p.is_alive()]
            if dead:
                return f"{_describe_dead(dead)} ({type(error).__name__}: {error})"
            time.sleep(0.05)
        return f"a tensor-parallel step failed: {type(error).__name__}: {error}; the engine cannot continue"

    def shutdown(self) -> None:
        """Stop the workers (asking first, then terminating) and leave the process group."""
        if self._error is None and self._finalizer.alive and all(p.is_alive() for p in self._workers):
            try:
                broadcast_command((STOP, None), self._control)
                self._stopping["graceful"] = True
            except Exception:  # noqa: BLE001 - a worker gone already: terminate the rest below
                log.warning("tensor parallel: could not ask the workers to stop; terminating them")
        self._finalizer()
        self.driver.shutdown()


def _tear_down(workers: list[BaseProcess], stopping: dict[str, bool]) -> None:
    """Terminate the workers (after a grace period when they were asked to stop); leave the process group."""
    deadline = time.monotonic() + (_STOP_TIMEOUT_S if stopping["graceful"] else 0.0)
    for proc in workers:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in workers:
        if proc.is_alive():
            proc.terminate()
            proc.join(_STOP_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
    if dist.is_initialized():
        dist.destroy_process_group()


def _describe_dead(dead: list[tuple[int, BaseProcess]]) -> str:
    parts = [f"rank {rank} (pid {p.pid}, exit code {p.exitcode})" for rank, p in dead]
    return f"tensor-parallel worker {', '.join(parts)} died; the engine cannot continue"

