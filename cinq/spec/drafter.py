"""Drafters: propose the draft tokens each running request verifies in its next step.

The scheduler calls ``propose`` for its decoding requests before it fills a step; a drafter writes
``request.spec_token_ids``. Every sampling feature stays exact under speculation (the runner scores row j of a
verify step with the first j drafts as output history: penalties, min_tokens bans, logprobs), so any decoding
request may get drafts; one without a match decodes one token, in the same batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cinq.spec.config import SpeculativeConfig
from cinq.spec.ngram import NgramProposer

if TYPE_CHECKING:
    from cinq.engine.request import Request


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
            if k == 0:
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
