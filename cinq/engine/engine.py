"""LLMEngine: the synchronous front end over an ``EngineCore`` in this process. One step = the core's step
(schedule -> execute the model -> update requests) -> the output processor (detokenize, stop strings, n-way
parents); a stop string or a request's own failure found here ends that sequence in the core before the next step.

The front end's halves (``InputProcessor``, ``OutputProcessor``) are the same objects ``AsyncMPLLM`` drives over a
core in its own process (engine/core_client.py)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from cinq.config import EngineConfig
from cinq.engine.core import EngineCore, available_memory_bytes  # noqa: F401 (available_memory_bytes: re-export)
from cinq.engine.executor import Executor
from cinq.engine.input_processor import InputProcessor
from cinq.engine.kv_cache import KVCacheManager
from cinq.engine.output_processor import OutputProcessor
from cinq.engine.scheduler import Scheduler
from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import EngineStats, RequestOutput
from cinq.sampling_params import SamplingParams
from cinq.step.request import RequestStatus

log = logging.getLogger(__name__)


class LLMEngine:
    """The synchronous engine: an ``EngineCore`` (model runner, scheduler, KV cache) with the front end's input
    and output processing. Not thread-safe; ``AsyncLLM`` drives it from one background loop."""

    def __init__(self, config: EngineConfig) -> None:
        self.core = EngineCore(config)
        core = self.core
        self.config = core.config
        self.device = core.device
        self.seed = core.seed
        self.default_sampling_params: dict[str, Any] = core.default_sampling_params
        try:
            self.tokenizer = Tokenizer.from_pretrained(self.config.tokenizer or self.config.model,
                                                       core.model_config.eos_token_ids, self.config.chat_template)
        except BaseException:
            core.shutdown()
            raise
        self.info = core.info()  # what MPLLMEngine learns from its core process: the same questions answered here
        self.input_processor = InputProcessor(self.info, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        # Requests that failed alone in the last step: request id -> "ErrorType: message" (AsyncLLM turns them
        # into RequestFailedError on their streams). Replaced every step, so it never grows.
        self.failed_requests: dict[str, str] = {}
        self.eos_token_ids = self.input_processor.eos_token_ids

    @property
    def executor(self) -> Executor:
        return self.core.executor

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def stats(self) -> EngineStats:
        return self.core.stats

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    @property
    def num_blocks(self) -> int:
        return self.core.num_blocks

    @property
    def model_config(self) -> ModelConfig:
        """The served model's config.json, parsed."""
        return self.core.model_config

    @property
    def vocab_size(self) -> int:
        """Token ids a prompt may hold: [0, vocab_size)."""
        return self.model_config.vocab_size

    @property
    def model(self) -> torch.nn.Module:
        """The model in this process (benchmarks and tools inspect its weights; serving never needs it)."""
        return self.executor.model  # type: ignore[attr-defined]

    @property
    def kv(self) -> KVCacheManager:
        return self.core.kv

    @property
    def num_waiting(self) -> int:
        """Requests queued but not running (preempted ones included)."""
        return self.core.num_waiting

    @property
    def num_running(self) -> int:
        return self.core.num_running

    # ---- requests ---------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None, prompt_text: str | None = None,
                    language: str | None = None) -> None:
        """Queue a request (text or token ids). Validates everything first: a bad request changes nothing.

        ``language``: an optional tag (<= 32 of ``[A-Za-z0-9_-]``) under which this request's speculative-decoding
        counters are also counted (``EngineStats.spec_decode_by_language``)."""
        if request_id in self.output_processor.parents:
            raise InvalidParameterError(f"request_id {request_id!r} is already in use", "request_id")
        req = self.input_processor.process(request_id, prompt, params, arrival_time, prompt_text, language)
        self.output_processor.add_request(request_id, req.prompt_text, req.prompt_token_ids, req.params,
                                          req.child_ids, req.arrival_time, req.language)
        for core_req in req.core_requests:
            self.core.add_request(core_req)

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Stop requests now and free their KV blocks; no further output is produced for them."""
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            children = self.output_processor.child_ids(rid)
            self.core.abort_requests(children or [rid], RequestStatus.FINISHED_ABORTED)
            self.output_processor.abort(rid)

    def shutdown(self) -> None:
        """Release the executor (a tensor-parallel one stops its worker processes); the engine is done after."""
        self.core.shutdown()

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    # ---- the loop ---------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step and return the outputs it produced.

        A request whose own processing raised (a bug in detokenizing or stop checking it, say) is finished alone:
        its final output has finish_reason ``"error"``, its blocks are freed, ``failed_requests`` maps its id to
        the error for this step, and every other request goes on. An error in the batched forward pass itself
        still raises from here (no single request to blame).
        """
        self.failed_requests = {}
        step = self.core.step()
        if not step.outputs and not step.first_scheduled_ids:
            return []
        outputs, stopped, failures = self.output_processor.process(step.outputs, step.first_scheduled_ids)
        if stopped:
            self.core.abort_requests(stopped, RequestStatus.FINISHED_STOPPED)
        for failure in failures:
            self.core.abort_requests(failure.child_ids, RequestStatus.FINISHED_ERROR)
            self.failed_requests[failure.request_id] = failure.error
            log.error("request %s failed inside the engine and was ended alone: %s", failure.request_id,
                      failure.error)
        return outputs

    def get_stats(self) -> EngineStats:
        """A snapshot of live state and counters."""
        return self.core.get_stats()
