"""Executor: the seam between the engine and the model runner(s), as vLLM's executor is.

The engine talks only to an executor: it asks it to load the model, says how many KV blocks to allocate, and
hands it each step's ``SchedulerOutput`` to get a ``RunnerOutput`` back. ``UniProcExecutor`` runs one
``ModelRunner`` in this process; ``MultiprocExecutor`` (engine/multiproc_executor.py: rank 0 here, one worker
process per other rank, rank 0 broadcasting the plain scheduler output) implements the same methods, each rank
running a ``UniProcExecutor`` over its shard. Which one runs follows ``EngineConfig.parallel_config``.

Process-wide settings (torch's thread count, glibc malloc tuning, building the native CPU kernels) happen in the
``UniProcExecutor`` of each process that runs the model (engine/uniproc_executor.py), once, at start-up: nothing
else in the engine touches global state.
"""

from __future__ import annotations

from typing import Protocol

from cinq.config import EngineConfig
from cinq.engine.multiproc_executor import MultiprocExecutor
from cinq.engine.uniproc_executor import UniProcExecutor
from cinq.model.config import ModelConfig
from cinq.step.runner_output import RunnerOutput
from cinq.step.scheduler_output import SchedulerOutput

__all__ = ["Executor", "MultiprocExecutor", "UniProcExecutor", "make_executor"]


class Executor(Protocol):
    """What the engine needs from whatever runs the model."""

    model_config: ModelConfig
    attention_backend: str

    def kv_bytes_per_block(self, block_size: int) -> int: ...

    def initialize_cache(self, num_blocks: int | tuple[int, int]) -> None: ...  # a pair: KV cache groups

    def execute_model(self, sched: SchedulerOutput) -> RunnerOutput: ...

    def shutdown(self) -> None: ...


def make_executor(config: EngineConfig, seed: int | None = None) -> Executor:
    """The executor for ``config.parallel_config``; ``seed``: the engine's sampling seed (default config.seed)."""
    if config.parallel_config.world_size == 1:
        return UniProcExecutor(config, seed)
    return MultiprocExecutor(config, seed)
