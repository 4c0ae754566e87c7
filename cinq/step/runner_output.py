"""What one forward step hands back to the scheduler (vLLM's ``ModelRunnerOutput``): the sampled tokens of each
request (several when drafts were accepted) and their raw logprobs. Plain data without torch."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprobs:
    """Raw logprobs at one position: the chosen token's, its rank, and the top-k (ids, values)."""

    token_id: int
    logprob: float
    rank: int
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass(slots=True)
class RunnerOutput:
    """What one forward step produced, by request id."""

    sampled: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # one entry per sampled token
    # prompt logprobs computed this step: request -> [(prompt position, TokenLogprobs)], position >= 1
    prompt_logprobs: dict[str, list[tuple[int, TokenLogprobs]]] = field(default_factory=dict)
    elapsed_s: float = 0.0  # wall time of the step's execution (adaptive speculation learns its costs from it)
    catch_up_s: float = 0.0  # of which the proposer's catch-up over positions committed undrafted (Proposals)

    @property
    def num_sampled_tokens(self) -> int:
        return sum(len(t) for t in self.sampled.values())
