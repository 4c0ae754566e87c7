"""Drafters: propose the draft tokens each running request verifies in its next step.

The scheduler calls ``propose`` for its decoding requests before it fills a step; the n-gram drafter writes
``request.spec_token_ids``, the others reserve ``request.num_draft_slots`` that the runner's proposer
(cinq/spec/proposer.py) fills. Every sampling feature stays exact under speculation (the runner scores row j of a
verify step with the first j drafts as output history: penalties, min_tokens bans, logprobs), so any decoding
request may get drafts; one without a match decodes one token, in the same batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cinq.spec.adaptive import AdaptiveK
from cinq.spec.config import SpeculativeConfig
from cinq.spec.ngram import NgramIndex, NgramProposer

if TYPE_CHECKING:
    from cinq.step.request import Request


class Drafter(Protocol):
    def propose(self, requests: list[Request], max_model_len: int) -> None: ...

    def observe(self, seconds: float | None, drafted: list[int], accepted: list[int]) -> None: ...


class _LengthChooser:
    """k per step: fixed (``num_speculative_tokens``, or its per-batch-size ranges) or adaptive
    (cinq/spec/adaptive.py), which learns from each decode-only step's cost and acceptance."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.adaptive = AdaptiveK(config.num_speculative_tokens) if config.adaptive else None  # type: ignore[arg-type]
        self._last: tuple[int, int] | None = None  # (batch size, k) of the step last proposed

    def choose_k(self, batch_size: int) -> int:
        k = self.config.k_for_batch_size(batch_size)
        if self.adaptive is not None:
            k = self.adaptive.choose(batch_size, k)
        self._last = (batch_size, k)
        return k

    def observe(self, seconds: float | None, drafted: list[int], accepted: list[int]) -> None:
        """What the last proposed step cost (wall seconds of its execution; None: not its arm's steady cost) and
        accepted, per request."""
        if self.adaptive is not None and self._last is not None:
            self.adaptive.observe(self._last[0], self._last[1], seconds, drafted, accepted)
        self._last = None


def draft_limit(req: Request, k: int, max_model_len: int) -> int:
    """At most ``k`` drafts: a step emits accepted drafts + 1 token, within max_tokens and the context."""
    return max(0, min(k, req.max_tokens - req.num_output_tokens - 1, max_model_len - req.num_tokens - 1))


class PromptLookup:
    """Each decoding request's ``NgramIndex`` over its own tokens, kept for the requests of the last step (one
    that skips a step, preempted or finished, is dropped, and indexed again if it comes back)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.proposer = NgramProposer(config.num_speculative_tokens,  # type: ignore[arg-type]
                                      config.prompt_lookup_min, config.prompt_lookup_max)  # type: ignore[arg-type]
        self.indexes: dict[str, NgramIndex] = {}

    def drafts(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        """Up to ``limits[i]`` prompt-lookup drafts for ``requests[i]`` (empty: no match). A request's index
        catches up with its tokens only when it may draft: with a limit of 0 nothing is searched."""
        indexes: dict[str, NgramIndex] = {}
        out: list[list[int]] = []
        for req, limit in zip(requests, limits):
            idx = self.indexes.get(req.request_id)
            if idx is None or len(idx) > len(req.all_token_ids):  # tokens only grow; anything else starts over
                idx = self.proposer.index()
            indexes[req.request_id] = idx
            if limit > 0:
                idx.extend(req.all_token_ids[len(idx):])
                out.append(idx.propose()[:limit])
            else:
                out.append([])
        self.indexes = indexes
        return out


class NgramDrafter(_LengthChooser):
    """Prompt-lookup drafts from each request's own tokens (``method: ngram``)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        super().__init__(config)
        self.lookup = PromptLookup(config)

    def propose(self, requests: list[Request], max_model_len: int) -> None:
        """Set ``spec_token_ids`` of the decoding ``requests`` (all of this step's decodes: they set k)."""
        k = self.choose_k(len(requests))
        drafts = self.lookup.drafts(requests, [draft_limit(req, k, max_model_len) for req in requests])
        for req, d in zip(requests, drafts):
            req.spec_token_ids = d


class SlotDrafter(_LengthChooser):
    """For proposers that run in the model runner (draft model, EAGLE, Medusa): reserve ``num_draft_slots`` per
    decoding request; the runner fills them before the forward.

    With a draft tree of n nodes and depth d, a request gets n slots when it may still emit d + 1 tokens and its
    context holds n more; otherwise a chain of what it may take (the runner verifies a tree only when a request
    got all n slots). With prompt lookup first (``SpeculativeConfig.lookup_first``), a request whose own tokens
    hold a match gets those drafts instead of slots, in the same step as the others: a copy costs no model call,
    and when it matches it is accepted far more often than a small head's guess (SmolLM2's chat replies repeat
    their own phrases). The proposer catches up over those positions when the request next wants its drafts. With a
    tree too, a copy is verified as a chain in the same step as the other requests' trees."""

    def __init__(self, config: SpeculativeConfig) -> None:
        super().__init__(config)
        self.tree_depth = config.tree_draft_depth
        self.tree_nodes = config.num_speculative_tokens if self.tree_depth else 0
        self.lookup = PromptLookup(config) if config.lookup_first else None

    def propose(self, requests: list[Request], max_model_len: int) -> None:
        k = self.choose_k(len(requests))
        limits = [draft_limit(req, k, max_model_len) for req in requests]
        copied = self.lookup.drafts(requests, limits) if self.lookup is not None else [[] for _ in requests]
        for req, limit, drafts in zip(requests, limits, copied):
            req.spec_token_ids = drafts
            if drafts:
                req.num_draft_slots = 0
            elif self.tree_nodes and k:
                depth_ok = draft_limit(req, self.tree_depth, max_model_len) == self.tree_depth
                room_ok = max_model_len - req.num_tokens - 1 >= self.tree_nodes
                req.num_draft_slots = self.tree_nodes if depth_ok and room_ok else \
                    draft_limit(req, self.tree_depth, max_model_len)
            else:
                req.num_draft_slots = limit


def make_drafter(config: SpeculativeConfig | None) -> Drafter | None:
    """The scheduler-side drafter for ``config`` (None: no speculation)."""
    if config is None:
        return None
    if config.method == "ngram":
        return NgramDrafter(config)
    return SlotDrafter(config)
