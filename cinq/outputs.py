"""What the engine hands back: RequestOutput (one per request per step it has news for) and its parts."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Logprob:
    """Log-probability of one token, its rank in the distribution (1 = most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (top-k plus the sampled/actual token).
PositionLogprobs = dict[int, Logprob]


@dataclass(slots=True)
class CompletionOutput:
    """One of the ``n`` completions of a request."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times (time.time()) of a request's life, for latency metrics."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0
    num_draft_tokens: int = 0  # speculative decoding: tokens proposed for this request, and of them accepted
    num_accepted_tokens: int = 0
    num_drafts: int = 0  # verify steps that carried drafts (tau = 1 + accepted / drafts)


@dataclass(slots=True)
class RequestOutput:
    """The state of one request as seen by a caller (cumulative, delta or final, per SamplingParams)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0


def mean_acceptance_length(num_accepted_tokens: int, num_drafts: int) -> float | None:
    """tau = 1 + accepted / drafts: the tokens a verify step emits on average (None before any draft). The one
    place tau is computed: stats, metrics, logs and benchmarks read it."""
    return 1 + num_accepted_tokens / num_drafts if num_drafts else None


@dataclass(slots=True)
class SpecDecodingStats:
    """vLLM's speculative-decoding counters for one slice of the traffic (here: one language tag)."""

    num_drafts: int = 0  # verify steps that carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verify step of one sequence."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens

    @property
    def mean_acceptance_length(self) -> float:
        """tau (0 before any draft)."""
        return mean_acceptance_length(self.num_accepted_tokens, self.num_drafts) or 0.0


@dataclass(slots=True)
class EngineStats:
    """Live engine state and counters since start (for /metrics, the playground and benchmarks)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use by live requests
    num_kv_blocks: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which found cached
    num_preemptions: int = 0
    prompt_tokens: int = 0  # prompt tokens computed (not counting cache hits)
    generation_tokens: int = 0
    num_steps: int = 0
    # running requests' KV: the slots of the blocks they hold (shared ones counted for each) and the tokens in
    # them; 1 - tokens / slots is the KV waste of the moment (the benchmarks' "KV waste")
    kv_slots_held: int = 0
    kv_tokens_held: int = 0
    finished_by_reason: dict[str, int] = field(default_factory=dict)
    # speculative decoding, vLLM's counters: verify steps with drafts, tokens drafted, accepted, accepted by position
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # the same counters for requests tagged with a language (untagged requests are only in the totals above);
    # past MAX_LANGUAGES tags (cinq.engine.spec_metrics) new ones are counted together under "*"
    spec_decode_by_language: dict[str, SpecDecodingStats] = field(default_factory=dict)

    @property
    def spec_decode_mean_acceptance_length(self) -> float:
        """tau (0 without speculation)."""
        return mean_acceptance_length(self.spec_decode_num_accepted_tokens, self.spec_decode_num_drafts) or 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
