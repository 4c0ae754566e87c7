"""SpeculativeConfig: vLLM's ``speculative_config`` fields and meaning, validated on construction, so that users'
configs carry over. Errors name the field and the allowed values.

``EngineConfig.speculative_config`` takes one (or its dict); only ``method: ngram`` is built in the engine yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from cinq.errors import InvalidParameterError

METHODS = ("ngram", "draft_model", "medusa", "eagle", "eagle3")
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


@dataclass(slots=True)
class SpeculativeConfig:
    """How requests speculate. ``method`` is inferred as ``draft_model`` when only ``model`` is given.

    ``num_speculative_tokens_per_batch_size``: inclusive ``(start, end, k)`` batch-size ranges, each overriding
    ``num_speculative_tokens`` (k = 0 turns speculation off for that range)."""

    method: str | None = None
    model: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] = field(default_factory=list)
    draft_sample_method: str = "greedy"

    def __post_init__(self) -> None:
        if self.method is None:
            if self.model is None:
                raise InvalidParameterError(
                    f"speculative_config: give 'method' (one of {list(METHODS)}) or a draft 'model'", "method")
            self.method = "draft_model"
        if self.method not in METHODS:
            raise InvalidParameterError(
                f"speculative_config.method must be one of {list(METHODS)}, got {self.method!r}", "method")
        if self.method != "ngram" and not self.model:
            raise InvalidParameterError(
                f"speculative_config: method {self.method!r} needs 'model' (the draft model or head folder)", "model")
        if self.num_speculative_tokens is None:
            raise InvalidParameterError("speculative_config.num_speculative_tokens is required", "num_speculative_tokens")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, 64)
        if self.method == "ngram":
            if self.prompt_lookup_max is None:
                raise InvalidParameterError("speculative_config: method 'ngram' needs prompt_lookup_max",
                                            "prompt_lookup_max")
            if self.prompt_lookup_min is None:
                self.prompt_lookup_min = self.prompt_lookup_max
            _check_int("prompt_lookup_min", self.prompt_lookup_min, 1, 1024)
            _check_int("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min, 1024)
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise InvalidParameterError(
                f"speculative_config.draft_sample_method must be one of {list(DRAFT_SAMPLE_METHODS)}, got "
                f"{self.draft_sample_method!r}", "draft_sample_method")
        self.num_speculative_tokens_per_batch_size = _check_ranges(self.num_speculative_tokens_per_batch_size)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeculativeConfig:
        """From the JSON object users pass as ``speculative_config``; unknown keys are errors."""
        if not isinstance(d, dict):
            raise InvalidParameterError(f"speculative_config must be a JSON object, got {type(d).__name__}",
                                        "speculative_config")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidParameterError(
                f"speculative_config: unknown field(s) {unknown}; known: {sorted(known)}", unknown[0])
        return cls(**d)

    def k_for_batch_size(self, batch_size: int) -> int:
        """Draft tokens per request at this batch size (0: do not speculate)."""
        for start, end, k in self.num_speculative_tokens_per_batch_size:
            if start <= batch_size <= end:
                return k
        return self.num_speculative_tokens  # type: ignore[return-value]


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidParameterError(f"speculative_config.{name} must be an integer in [{lo}, {hi}], got {value!r}",
                                    name)


def _check_ranges(ranges: object) -> list[tuple[int, int, int]]:
    name = "num_speculative_tokens_per_batch_size"
    if not isinstance(ranges, (list, tuple)):
        raise InvalidParameterError(f"speculative_config.{name} must be a list of [start, end, k]", name)
    out: list[tuple[int, int, int]] = []
    for r in ranges:
        if not isinstance(r, (list, tuple)) or len(r) != 3:
            raise InvalidParameterError(f"speculative_config.{name}: each entry is [start, end, k], got {r!r}", name)
        start, end, k = r
        _check_int(f"{name} start", start, 1, 1 << 16)
        _check_int(f"{name} end", end, start, 1 << 16)
        _check_int(f"{name} k", k, 0, 64)
        out.append((start, end, k))
    out.sort()
    for (s0, e0, _), (s1, _, _) in zip(out, out[1:]):
        if s1 <= e0:
            raise InvalidParameterError(
                f"speculative_config.{name}: ranges [{s0}, {e0}] and one starting at {s1} overlap", name)
    return out
