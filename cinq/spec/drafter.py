"""Drafters: propose the draft tokens each running request verifies in its next step.

The scheduler calls ``propose`` for its decoding requests before it fills a step; a drafter writes
``request.spec_token_ids``. Only requests whose sampling stays exact under speculation get drafts (see
``speculation_allowed``); the others decode one token per step as before, in the same batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cinq.sampling_params import SamplingParams
from cinq.spec.config import SpeculativeConfig
from cinq.spec.ngram import NgramProposer

if TYPE_CHECKING:
    from cinq.engine.request import Request


def speculation_allowed(params: SamplingParams, num_output_tokens: int) -> bool:
    """Whether a request may speculate now. Not yet exact here, so such requests decode plainly: repetition /
    presence / frequency penalties (each verified row would need the drafts before it as history) and
    min_tokens not reached yet (its bans depend on the row). Logprobs are kept: the target's, per emitted token."""
    return not params.has_penalties and num_output_tokens >= params.min_tokens


class Drafter(Protocol):
    def propose(self, requests: list[Request], max_model_len: int) -> None: ...


class NgramDrafter:
    """Prompt-lookup drafts from each request's own tokens (``method: ngram``)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.proposer = NgramProposer(config.num_speculative_tokens,  # type: ignore[arg-type]
                                      config.prompt_lookup_min, config.prompt_lookup_max)  # type: ignore[arg-type]

    def propose(self, requests: list[Request], max_model_len: int) -> None:
        """Set ``spec_token_ids`` of the decoding ``requests`` (all of this step's decodes: they set k)."""
        k = self.config.k_for_batch_size(len(requests))
        for req in requests:
            req.spec_token_ids = []
            if k == 0 or not speculation_allowed(req.sampling_params, req.num_output_tokens):
                continue
            # the step emits accepted drafts + 1 token: stay within max_tokens and the context
            limit = min(k, req.max_tokens - req.num_output_tokens - 1, max_model_len - req.num_tokens - 1)
            if limit > 0:
                req.spec_token_ids = self.proposer.propose(req.all_token_ids)[:limit]


def make_drafter(config: SpeculativeConfig | None) -> Drafter | None:
    """The drafter for ``config`` (None: no speculation)."""
    if config is None:
        return None
    if config.method == "ngram":
        return NgramDrafter(config)
    raise ValueError(f"speculative_config.method {config.method!r} is not built yet")
