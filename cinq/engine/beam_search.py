"""Beam search as vLLM runs it: in the front end, over the engine's one-token generations.

Each step every live beam is sent as a prompt for one token with its top ``2 * beam_width`` logprobs; each of those
tokens extends the beam (cumulative log-probability added up); an end token closes the extension into the finished
list, and the ``beam_width`` best of the rest go on. After ``max_tokens`` steps (or when no beam is left) the live
beams join the finished ones and the best ``beam_width`` by ``cum_logprob / generated_len ** length_penalty`` are
returned. The prefix cache makes resending a beam cost about its last block. Unlike vLLM, the length in the score is
the generated tokens' (Hugging Face's), not prompt plus generated: a long prompt then does not flatten the penalty.

``BeamSearch`` holds the state of one prompt's search; ``LLM.beam_search`` (offline) and the server's
``use_beam_search`` drive it with their own engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cinq.errors import InvalidParameterError
from cinq.outputs import RequestOutput
from cinq.sampling_params import MAX_LOGPROBS, OutputKind, SamplingParams

MAX_BEAM_WIDTH = MAX_LOGPROBS // 2  # each step asks for 2 * beam_width logprobs


@dataclass(slots=True)
class BeamSearchParams:
    """vLLM's ``BeamSearchParams``: ``beam_width`` beams (and results), ``max_tokens`` steps at most."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name, value, lo, hi in (("beam_width", self.beam_width, 1, MAX_BEAM_WIDTH),
                                    ("max_tokens", self.max_tokens, 1, 1 << 24)):
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise InvalidParameterError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}", name)
        if not isinstance(self.length_penalty, (int, float)) or not -10 <= self.length_penalty <= 10:
            raise InvalidParameterError(f"length_penalty must be a number in [-10, 10], got {self.length_penalty!r}",
                                        "length_penalty")
        SamplingParams(temperature=self.temperature)  # the same range check

    def step_params(self) -> SamplingParams:
        """One step of one beam: one token, the top ``2 * beam_width`` logprobs (end tokens included)."""
        return SamplingParams(max_tokens=1, logprobs=2 * self.beam_width, temperature=self.temperature,
                              ignore_eos=True, output_kind=OutputKind.FINAL_ONLY)


@dataclass(slots=True)
class BeamSearchSequence:
    """One beam: prompt and generated tokens, each generated token's logprob, their sum, the decoded text."""

    tokens: list[int]
    logprobs: list[float] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None

    def score(self, length_penalty: float) -> float:
        return self.cum_logprob / max(1, len(self.logprobs)) ** length_penalty


@dataclass(slots=True)
class BeamSearchOutput:
    """The ``beam_width`` best sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


class BeamSearch:
    """One prompt's search: ``live`` beams to send, ``advance`` with their one-token outputs, ``result`` at the end."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_ids: list[int],
                 max_model_len: int) -> None:
        self.params, self.eos = params, set(eos_token_ids)
        self.prompt_len = len(prompt_token_ids)
        self.room = min(params.max_tokens, max_model_len - self.prompt_len)  # the steps the context allows
        self.live = [BeamSearchSequence(list(prompt_token_ids))]
        self.finished: list[BeamSearchSequence] = []
        self.steps = 0

    @property
    def done(self) -> bool:
        return not self.live or self.steps >= self.room

    def advance(self, outputs: list[RequestOutput]) -> None:
        """Extend every live beam (``outputs[i]`` is beam i's one-token generation) and keep the best."""
        width = self.params.beam_width
        candidates = []
        for beam, out in zip(self.live, outputs):
            (top,) = out.outputs[0].logprobs or [{}]
            for token, lp in sorted(top.items(), key=lambda kv: kv[1].rank or 0)[:2 * width]:
                new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [lp.logprob],
                                         beam.cum_logprob + lp.logprob)
                if token in self.eos and not self.params.ignore_eos:
                    new.finish_reason = "stop"
                    self.finished.append(new)
                else:
                    candidates.append(new)
        candidates.sort(key=lambda b: b.cum_logprob, reverse=True)
        self.live = candidates[:width]
        self.steps += 1

    def result(self) -> list[BeamSearchSequence]:
        """The ``beam_width`` best, finished and live together (live ones ended by length), best first."""
        for beam in self.live:
            beam.finish_reason = "length"
        ranked = sorted(self.finished + self.live, key=lambda b: b.score(self.params.length_penalty), reverse=True)
        return ranked[:self.params.beam_width]

    def generated(self, beam: BeamSearchSequence) -> list[int]:
        return beam.tokens[self.prompt_len:]
