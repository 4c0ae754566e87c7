"""The one batch-1 decode timer: a greedy request run alone on an engine, each token's arrival timed. The latency
benchmark, the throughput benchmark's batch-1 row and the quality study's decode speed all read it, so their
tok/s figures mean the same thing (decode steps only: the prefill step that yields the first token is TTFT)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cinq.sampling_params import SamplingParams

if TYPE_CHECKING:
    from cinq.engine.protocol import OfflineEngine

_REQUEST_IDS = itertools.count()


@dataclass(slots=True)
class TokenTimes:
    """One greedy generation: seconds from prompt in to first token out, the gaps between later tokens (one decode
    step each), and the tokens (empty where the engine does not hand them back)."""

    ttft_s: float
    gaps_s: list[float]
    tokens: list[int] = field(default_factory=list)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first over the time they took (0 when there were none)."""
        return len(self.gaps_s) / sum(self.gaps_s) if self.gaps_s and sum(self.gaps_s) > 0 else 0.0


def time_greedy_request(engine: OfflineEngine, prompt: list[int], new_tokens: int) -> TokenTimes:
    """Run one greedy request of ``new_tokens`` tokens (end of text ignored) on an otherwise idle ``engine``,
    timing each step that hands back a token."""
    engine.add_request(f"timed-{next(_REQUEST_IDS)}", list(prompt),
                       SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    start = time.perf_counter()
    times: list[float] = []
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        outs = engine.step()
        if outs:  # one (cumulative) output per step that produced a token for the request
            times.append(time.perf_counter())
            tokens = list(outs[-1].outputs[0].token_ids)
    return TokenTimes(times[0] - start, [b - a for a, b in zip(times, times[1:])], tokens)
