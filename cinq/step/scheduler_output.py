"""What the scheduler hands the runner each step (vLLM's ``SchedulerOutput``): the requests to compute and their
token chunks, the ones new to the runner and the ones to forget. Plain data without torch: the scheduler never
sees tensors, and the proposers in spec/ read the same chunks.

Every shape allows several tokens per request per step (a speculative verify step scores k draft tokens and may
accept several), so nothing here assumes "one new token".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cinq.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    """What the runner needs to know about a request the first time it is scheduled."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams


@dataclass(slots=True)
class ScheduledSeq:
    """One request's share of a step: compute ``token_ids`` at positions ``start_pos ...``.

    The last ``num_logit_rows`` rows of the chunk produce logits: 0 for a prefill chunk that stops short of the
    last known token, 1 to sample the next token (a k-token draft verified in one step would ask for k + 1).
    """

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_ids: list[int]
    num_logit_rows: int
    num_output_tokens: int = 0  # the request's output length before this step (min_tokens bans read it)
    # Draft positions after ``token_ids`` that the runner's proposer fills before the forward (a draft model or
    # head); their slots and budget are reserved and ``num_logit_rows`` counts them. 0 for n-gram drafts, which
    # the scheduler puts in ``token_ids`` itself.
    num_draft_slots: int = 0
    # KV cache groups (engine/kv_cache_groups.py): the request's block table in each group (``block_ids`` is
    # group 0's); None with one group
    group_block_ids: list[list[int]] | None = None


@dataclass(slots=True)
class SchedulerOutput:
    """Everything one step computes, and what the runner must learn or forget first."""

    seqs: list[ScheduledSeq] = field(default_factory=list)
    new_requests: list[NewRequestData] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)  # runner state to drop
    num_batched_tokens: int = 0
    num_prompt_tokens: int = 0  # of the batched tokens, those at prompt positions (first computation or not)
    preempted_request_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.seqs
