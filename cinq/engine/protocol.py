"""EngineClient: the one interface the server, ``cinq bench serve`` and the data-parallel front end use to drive an
engine (vLLM's ``EngineClient``), and ``make_engine_client`` to build one; ``OfflineEngine``, its synchronous
counterpart (``LLMEngine``'s add_request / step interface) behind the offline ``LLM``, ``cinq generate``, ``cinq
chat`` and ``cinq tune``, and ``make_llm_engine``.

Three implementations: ``AsyncLLM`` (engine/async_engine.py: the core in a thread of this process),
``AsyncMPLLM`` (engine/async_mp_llm.py: the core in its own process behind ZMQ, the server's default) and
``DPAsyncLLM`` (dp/dp_engine.py: replicas on Ray). Callers read limits and stats here, never an engine's rooms:
stats are what the core publishes (``get_stats``), limits what it said at start-up.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Literal, Protocol

from cinq.config import EngineConfig
from cinq.engine.io import EngineCoreInfo
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import EngineStats, RequestOutput
from cinq.sampling_params import SamplingParams

EngineCoreMode = Literal["process", "inproc"]
ENGINE_CORE_MODES = ("process", "inproc")


class RequestStreamLike(Protocol):
    """One request's outputs (``AsyncLLM.RequestStream`` and the data-parallel one)."""

    request_id: str
    finished: bool

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...

    def abort(self) -> None: ...


class ServedModel(Protocol):
    """What both front-end interfaces say of the model they serve: its configuration, tokenizer and limits."""

    config: EngineConfig

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...


class EngineClient(ServedModel, Protocol):
    """What a front end offers its callers (see the module docstring)."""

    finished_callbacks: list[Callable[[RequestOutput], None]]
    num_step_failures: int
    dead_error: str | None  # why the engine is gone (None while it runs, or when it was merely shut down)

    @property
    def architecture(self) -> str: ...

    @property
    def default_sampling_params(self) -> dict[str, Any]: ...

    @property
    def is_running(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def stats_time(self) -> float: ...

    def start(self) -> None: ...

    def shutdown(self, timeout: float = 10.0) -> None: ...

    async def shutdown_async(self, timeout: float = 10.0) -> None: ...

    async def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                          prompt_text: str | None = None, arrival_time: float | None = None,
                          language: str | None = None) -> RequestStreamLike: ...

    def generate(self, prompt: str | list[int], params: SamplingParams, request_id: str,
                 prompt_text: str | None = None, arrival_time: float | None = None,
                 language: str | None = None) -> AsyncGenerator[RequestOutput, None]: ...

    def abort(self, request_id: str) -> None: ...

    def get_stats(self) -> EngineStats: ...


class OfflineEngine(ServedModel, Protocol):
    """The synchronous front end: ``LLMEngine`` (the core in this process) or ``MPLLMEngine`` (the core in its own
    process). Not thread-safe; one caller drives it with ``step()``."""

    info: EngineCoreInfo  # the core's limits and sizes, as it reported them at start-up
    failed_requests: dict[str, str]  # of the last step: request id -> error, for requests that failed alone
    default_sampling_params: dict[str, Any]

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None, prompt_text: str | None = None,
                    language: str | None = None) -> None: ...

    def abort_request(self, request_ids: str | list[str]) -> None: ...

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...

    def get_stats(self) -> EngineStats: ...

    def shutdown(self) -> None: ...


# The offline front ends' placement when none is given (vLLM's VLLM_ENABLE_V1_MULTIPROCESSING, by our names):
# "process" unless this variable says "inproc" (the test suite does: its tests reach llm.engine's scheduler).
ENGINE_CORE_ENV = "CINQ_ENGINE_CORE"


def default_offline_engine_core() -> EngineCoreMode:
    """Where the offline front ends put the core by default: ``$CINQ_ENGINE_CORE``, else ``"process"``, as in vLLM v1,
    so offline use runs the server's core; on offline batches the two placements measured within run-to-run
    spread (process / in-process 0.97x-1.03x on SmolLM2-135M, 0.94x-1.08x on cinq-tiny, quiet;
    benchmarks/offline_engine_core.py)."""
    mode = os.environ.get(ENGINE_CORE_ENV) or "process"
    check_engine_core(mode, ENGINE_CORE_ENV)
    return mode  # type: ignore[return-value]


def make_llm_engine(config: EngineConfig, engine_core: EngineCoreMode | None = None) -> OfflineEngine:
    """One engine behind the ``OfflineEngine`` interface: its core in its own process (``"process"``: detokenizing
    here overlaps the next step there) or here (``"inproc"``: tools may reach the model and the scheduler); None:
    ``default_offline_engine_core()``."""
    engine_core = engine_core or default_offline_engine_core()
    check_engine_core(engine_core)
    if engine_core == "process":
        from cinq.engine.mp_engine import MPLLMEngine
        return MPLLMEngine(config)
    from cinq.engine.engine import LLMEngine
    return LLMEngine(config)


def check_engine_core(engine_core: str, name: str = "engine_core") -> None:
    """``engine_core`` (given as ``name``) must be one of ``ENGINE_CORE_MODES``."""
    if engine_core not in ENGINE_CORE_MODES:
        from cinq.errors import InvalidParameterError
        raise InvalidParameterError(f"{name} must be one of {', '.join(ENGINE_CORE_MODES)}, got {engine_core!r}",
                                    name)


def make_engine_client(config: EngineConfig, max_waiting_requests: int | None = None,
                       engine_core: EngineCoreMode = "process") -> EngineClient:
    """One engine behind the ``EngineClient`` interface: its core in its own process (``"process"``, the
    server's default: the step loop does not share the GIL with HTTP) or in a thread here (``"inproc"``)."""
    check_engine_core(engine_core)
    if engine_core == "process":
        from cinq.engine.async_mp_llm import AsyncMPLLM
        return AsyncMPLLM(config, max_waiting_requests)
    from cinq.engine.async_engine import AsyncLLM
    return AsyncLLM.from_config(config, max_waiting_requests)
