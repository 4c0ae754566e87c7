"""The plain data that crosses between the engine's rooms, in one module without torch.

Each step (the step's own data lives below spec/, in cinq/step/, because the proposers read it too):

    Scheduler.schedule()        -> SchedulerOutput   (step/scheduler_output.py: ScheduledSeq, NewRequestData)
    Executor.execute_model(...) -> RunnerOutput      (step/runner_output.py: sampled token ids, logprobs)
    Scheduler.update(...)       -> [EngineCoreOutput] (what is new for each request this step, finish reasons)
    OutputProcessor.process(...) turns EngineCoreOutputs into RequestOutputs (text, stop strings, n-way parents)

and what crosses between the front end and the engine core (engine/core.py), in one process or over ZMQ
(engine/core_proc.py, serialised by engine/serial.py):

    EngineCoreRequest   front end -> core: one sequence to generate (token ids, resolved params, arrival, tag)
    EngineCoreOutputs   core -> front end: one step's EngineCoreOutputs, first-scheduled ids, the core's stats
    EngineCoreInfo      core -> front end once, at start-up: what validation and the server need to know

Every shape allows several tokens per request per step (a speculative verify step scores k draft tokens and may
accept several), so nothing here assumes "one new token".
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cinq.outputs import EngineStats
from cinq.sampling_params import SamplingParams
from cinq.step.runner_output import TokenLogprobs


@dataclass(slots=True)
class EngineCoreOutput:
    """One request's news from one step, as the scheduler accepted it (vLLM's ``EngineCoreOutput``).

    ``new_token_ids`` are the tokens appended this step (possibly several, possibly none: a chunk that only
    produced prompt logprobs); ``finish_reason`` is set when a token-level stop ended the request this step.
    """

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per new token, when asked for
    new_prompt_logprobs: list[tuple[int, TokenLogprobs]] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" (token-level stops; stop strings are found later)
    stop_reason: int | str | None = None  # the stop token id, when one ended the request
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first scheduling
    num_draft_tokens: int = 0  # drafts verified this step, and how many of them were accepted
    num_accepted_tokens: int = 0
    # Set, with finish_reason "error", when updating this request alone raised: the request is finished and its
    # blocks freed; the output processor then fails its whole parent (all n completions) with this message.
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class EngineCoreRequest:
    """One sequence for the engine core (vLLM's ``EngineCoreRequest``): already tokenized and validated by the
    front end, ``max_tokens`` resolved against the context, the model's eos ids in ``sampling_params``. ``n > 1``
    arrives as n of these (``"{i}_{id}"``)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int
    arrival_time: float
    language: str | None = None


@dataclass(slots=True)
class EngineCoreOutputs:
    """What one core step produced (vLLM's ``EngineCoreOutputs``). ``stats`` is the core's snapshot after the
    step (callers read engine state only from here, never from the scheduler); ``step_error``, set when the
    whole step raised, means every request the core held was ended (their ids in ``failed_request_ids``)."""

    outputs: list[EngineCoreOutput] = field(default_factory=list)
    first_scheduled_ids: list[str] = field(default_factory=list)  # children scheduled for the first time
    stats: EngineStats | None = None
    timestamp: float = 0.0
    step_error: str | None = None
    failed_request_ids: list[str] = field(default_factory=list)
    num_added: int = 0  # sequences the core has taken in since it started (the front end's waiting count)


@dataclass(slots=True)
class EngineCoreInfo:
    """What the front end learns from the core once it has loaded: enough to tokenize, validate requests and
    answer the server's questions (limits, defaults) without touching the model."""

    model: str  # the resolved model folder
    architecture: str
    vocab_size: int
    max_model_len: int
    num_blocks: int
    block_size: int
    model_eos_token_ids: list[int]
    default_sampling_params: dict[str, object]
    seed: int
    attention_backend: str = ""
    pid: int = 0  # the core's process (the front end's own pid when in-process)
    kv_bytes_per_block: int = 0  # KV cache bytes of one block, all layers (and a draft model's), K and V
    weight_bytes: int = 0  # the target's weights plus its proposer's modules (benchmarks' memory column)
    step_read_bytes: int = 0  # of which a decode step streams (no unshared embedding table: the roofline's bytes)
    # the most blocks one request can hold: num_blocks, or with KV cache groups the full-attention group's (a
    # request the budget's count admitted but the group could not hold waited forever); 0: num_blocks
    request_blocks: int = 0
