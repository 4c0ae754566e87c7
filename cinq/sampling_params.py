"""SamplingParams with vLLM / OpenAI semantics. Out-of-range values raise ``InvalidParameterError`` naming the
field and its range at construction, before any work is done."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cinq.errors import InvalidParameterError
from cinq.structured.params import StructuredOutputsParams

MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's range, -100..100
MAX_BAD_WORDS = 128  # each is checked against the output at every step
_GREEDY_EPS = 1e-5


class OutputKind(enum.Enum):
    """What each RequestOutput carries: everything so far, only what is new, or only the final result."""

    CUMULATIVE = "cumulative"
    DELTA = "delta"
    FINAL_ONLY = "final_only"


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request's continuation (defaults match vLLM)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the model context; 0: no completion (scoring: with prompt_logprobs)
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k logprobs per generated token (the sampled token is always included)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # Keep only the prompt's last k tokens (-1: the model's context length), as vLLM's; None: no truncation
    truncate_prompt_tokens: int | None = None
    output_kind: OutputKind = OutputKind.CUMULATIVE
    # Added to the logits before penalties and sampling (OpenAI's, -100..100 per token id), and the only tokens that
    # may be sampled: both as vLLM's, greedy requests included
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    # Words never to generate (vLLM's): a word's last token is banned wherever its other tokens end the output
    bad_words: list[str] | None = None
    # Constrained decoding (JSON schema, regex, choice, grammar, any JSON object): cinq/structured/.
    structured_outputs: StructuredOutputsParams | None = None
    # Filled by the engine from the model's generation config; not user-facing.
    eos_token_ids: list[int] = field(default_factory=list)
    # Filled by the engine from bad_words and its tokenizer; not user-facing.
    bad_words_token_ids: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = _as_list(self.stop, "stop", "a string or a list of strings")
        self.stop_token_ids = _as_list(self.stop_token_ids, "stop_token_ids", "a list of token ids")
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self.validate()

    def validate(self) -> None:
        """Check every field's type and range; raise InvalidParameterError naming the first bad one."""
        _int(self.n, "n", 1, 128)
        _num(self.temperature, "temperature", 0.0, 100.0)
        _num(self.top_p, "top_p", 0.0, 1.0, lo_open=True)
        _int(self.top_k, "top_k", -1, 1 << 30)
        _num(self.min_p, "min_p", 0.0, 1.0)
        _num(self.presence_penalty, "presence_penalty", -2.0, 2.0)
        _num(self.frequency_penalty, "frequency_penalty", -2.0, 2.0)
        _num(self.repetition_penalty, "repetition_penalty", 0.0, 100.0, lo_open=True)
        if self.seed is not None:
            _int(self.seed, "seed", -(1 << 63), (1 << 63) - 1)
        if self.max_tokens is not None:
            _int(self.max_tokens, "max_tokens", 0, 1 << 24)
        _int(self.min_tokens, "min_tokens", 0, 1 << 24)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidParameterError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})", "min_tokens")
        if self.truncate_prompt_tokens is not None:
            _int(self.truncate_prompt_tokens, "truncate_prompt_tokens", -1, 1 << 24)
            if self.truncate_prompt_tokens == 0:
                raise InvalidParameterError("truncate_prompt_tokens must be -1 (the context length) or at least 1, "
                                            "got 0", "truncate_prompt_tokens")
        if self.logprobs is not None:
            _int(self.logprobs, "logprobs", 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _int(self.prompt_logprobs, "prompt_logprobs", 0, MAX_LOGPROBS)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidParameterError(f"stop strings must be non-empty strings, got {s!r}", "stop")
        if len(self.stop) > 16:
            raise InvalidParameterError(f"stop may hold at most 16 strings, got {len(self.stop)}", "stop")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise InvalidParameterError(f"stop_token_ids must be non-negative integers, got {t!r}",
                                            "stop_token_ids")
        if self.logit_bias is not None:
            _check_logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _as_list(self.allowed_token_ids, "allowed_token_ids", "a list of token ids")
            if not self.allowed_token_ids:
                raise InvalidParameterError("allowed_token_ids must hold at least one token id", "allowed_token_ids")
            for t in self.allowed_token_ids:
                if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                    raise InvalidParameterError(f"allowed_token_ids must be non-negative integers, got {t!r}",
                                                "allowed_token_ids")
        if self.bad_words is not None:
            self.bad_words = _as_list(self.bad_words, "bad_words", "a list of strings")
            if len(self.bad_words) > MAX_BAD_WORDS:
                raise InvalidParameterError(f"bad_words may hold at most {MAX_BAD_WORDS} words, got "
                                            f"{len(self.bad_words)}", "bad_words")
            for w in self.bad_words:
                if not isinstance(w, str) or not w.strip():
                    raise InvalidParameterError(f"bad_words must be non-blank strings, got {w!r:.40}", "bad_words")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                   StructuredOutputsParams):
            raise InvalidParameterError(f"structured_outputs must be a StructuredOutputsParams, got "
                                        f"{type(self.structured_outputs).__name__}", "structured_outputs")
        if not isinstance(self.output_kind, OutputKind):
            raise InvalidParameterError(f"output_kind must be an OutputKind, got {self.output_kind!r}", "output_kind")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def has_logit_bias(self) -> bool:
        """True when the logits get a bias or a mask of allowed tokens before sampling."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def clone(self, **changes: object) -> SamplingParams:
        """A copy with some fields changed (validated again)."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["stop"] = list(self.stop)
        values["stop_token_ids"] = list(self.stop_token_ids)
        values["eos_token_ids"] = list(self.eos_token_ids)
        values["logit_bias"] = None if self.logit_bias is None else dict(self.logit_bias)
        values["allowed_token_ids"] = None if self.allowed_token_ids is None else list(self.allowed_token_ids)
        values["bad_words"] = None if self.bad_words is None else list(self.bad_words)
        values["bad_words_token_ids"] = [list(w) for w in self.bad_words_token_ids]
        values.update(changes)
        return SamplingParams(**values)  # type: ignore[arg-type]




def _check_logit_bias(bias: object) -> None:
    """A dict of token id (int >= 0) -> finite bias in [-100, 100]; an error naming logit_bias otherwise."""
    if not isinstance(bias, dict):
        raise InvalidParameterError(f"logit_bias must be a dict of token id -> bias, got {type(bias).__name__}",
                                    "logit_bias")
    for t, b in bias.items():
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise InvalidParameterError(f"logit_bias keys must be non-negative token ids, got {t!r}", "logit_bias")
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
            raise InvalidParameterError(f"logit_bias values must be numbers in [-100, 100], got {b!r} for token {t}",
                                        "logit_bias")


def _as_list(value: object, name: str, what: str) -> list:
    """``value`` (None, a list or a tuple) as a new list; anything else names the field (``stop=5`` raised a bare
    TypeError)."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise InvalidParameterError(f"{name} must be {what}, got {value!r}", name)
    return list(value)


def _num(value: object, name: str, lo: float, hi: float, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidParameterError(f"{name} must be a number, got {value!r}", name)
    if value > hi or value < lo or (lo_open and value == lo):
        left = "(" if lo_open else "["
        raise InvalidParameterError(f"{name} must be in {left}{lo}, {hi}], got {value}", name)


def _int(value: object, name: str, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameterError(f"{name} must be an integer, got {value!r}", name)
    if not lo <= value <= hi:
        raise InvalidParameterError(f"{name} must be in [{lo}, {hi}], got {value}", name)
