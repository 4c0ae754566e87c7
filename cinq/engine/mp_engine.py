"""MPLLMEngine: ``LLMEngine``'s synchronous interface (add_request / step / abort_request) with the engine core in
its own process, for the offline ``LLM(..., engine_core="process")``.

``step()`` waits for the core's next ``EngineCoreOutputs`` (the core steps on its own as long as it has work, so
detokenizing here overlaps the next step there) and runs the output processor on it; a stop string or a request's
own failure found here is sent back as an abort. A dead core raises ``EngineDeadError`` naming how it died.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from cinq.config import EngineConfig
from cinq.engine.async_engine import EngineDeadError, RequestFailedError
from cinq.engine.core_client import CoreDiedError, CoreProcClient
from cinq.engine.input_processor import InputProcessor
from cinq.engine.output_processor import OutputProcessor
from cinq.errors import InvalidParameterError
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import EngineStats, RequestOutput
from cinq.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class MPLLMEngine:
    """The offline front end over a core process (see the module docstring). Not thread-safe."""

    def __init__(self, config: EngineConfig) -> None:
        self.client = CoreProcClient(config)
        try:
            info = self.client.info
            self.config = config if info.model == config.model else dataclasses.replace(config, model=info.model)
            self.tokenizer = Tokenizer.from_pretrained(config.tokenizer or info.model, info.model_eos_token_ids,
                                                       config.chat_template)
        except BaseException:
            self.client.shutdown()
            raise
        self.info = info
        self.seed = info.seed
        self.default_sampling_params: dict[str, Any] = info.default_sampling_params
        self.input_processor = InputProcessor(info, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.eos_token_ids = self.input_processor.eos_token_ids
        self.failed_requests: dict[str, str] = {}
        self._stats = EngineStats(num_kv_blocks=info.num_blocks)

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def num_blocks(self) -> int:
        return self.info.num_blocks

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    def model(self) -> Any:
        raise AttributeError("the model lives in the engine core's process (engine_core='process'); use "
                             "engine_core='inproc' to inspect it")

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None, prompt_text: str | None = None,
                    language: str | None = None) -> None:
        """As ``LLMEngine.add_request``: validated here, then sent to the core."""
        if request_id in self.output_processor.parents:
            raise InvalidParameterError(f"request_id {request_id!r} is already in use", "request_id")
        req = self.input_processor.process(request_id, prompt, params, arrival_time, prompt_text, language)
        self.output_processor.add_request(request_id, req.prompt_text, req.prompt_token_ids, req.params,
                                          req.child_ids, req.arrival_time, req.language)
        try:
            self.client.add(req.core_requests)
        except CoreDiedError as e:
            self.output_processor.abort(request_id)
            raise EngineDeadError(str(e)) from None

    def abort_request(self, request_ids: str | list[str]) -> None:
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            children = self.output_processor.child_ids(rid)
            self.output_processor.abort(rid)
            self.client.abort(children, "abort")

    def has_unfinished_requests(self) -> bool:
        return bool(self.output_processor.parents)

    def step(self) -> list[RequestOutput]:
        """The outputs of the core's next step (waits for it)."""
        self.failed_requests = {}
        while True:
            try:
                step = self.client.recv(1000)
            except CoreDiedError as e:
                self.output_processor.parents.clear()
                self.output_processor.children.clear()
                raise EngineDeadError(str(e)) from None
            if step is not None:
                break
        if step.stats is not None:
            self._stats = step.stats
        processor = self.output_processor
        if step.step_error is not None:  # as LLMEngine.step: a failed batch raises (the core goes on)
            for rid in {processor.children[c][0].request_id for c in step.failed_request_ids
                        if c in processor.children}:
                processor.abort(rid)
            raise RequestFailedError(f"internal engine error: {step.step_error}")
        known = [o for o in step.outputs if o.request_id in processor.children]
        first = [rid for rid in step.first_scheduled_ids if rid in processor.children]
        if not known and not first:
            return []
        outputs, stopped, failures = processor.process(known, first)
        self.client.abort(stopped, "stop")
        for failure in failures:
            self.client.abort(failure.child_ids, "error")
            self.failed_requests[failure.request_id] = failure.error
        return outputs

    def get_stats(self) -> EngineStats:
        """The core's stats as of its last step."""
        return self._stats

    def shutdown(self) -> None:
        self.client.shutdown()
