"""The configuration space ``cinq tune`` searches: quantized weights (method, bits), speculative decoding
(method and k), KV budget, token budget and max sequences, one ``Candidate`` per combination."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded_each, check_bounds


@dataclass(slots=True, frozen=True)
class Candidate:
    """One point of the space. ``quant``: a ``cinq.quant.variants`` entry ("gptq:4/128") or "none";
    ``spec_k``: drafts per step (0: no speculation); ``kv_tokens``: the KV cache in tokens (None: the engine's
    own sizing from its memory budget)."""

    quant: str
    spec_k: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_tokens: int | None

    @property
    def label(self) -> str:
        kv = "auto" if self.kv_tokens is None else str(self.kv_tokens)
        spec = f"spec k={self.spec_k}" if self.spec_k else "no spec"
        return (f"{self.quant}, {spec}, seqs {self.max_num_seqs}, tokens {self.max_num_batched_tokens}, "
                f"kv {kv}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class SearchSpace:
    """The values of each dimension (the space is their product)."""

    quants: tuple[str, ...] = ("none", "gptq:4/128")
    spec_ks: tuple[int, ...] = bounded_each((0, 3), ge=0)
    max_num_seqs: tuple[int, ...] = bounded_each((8, 64), ge=1)
    max_num_batched_tokens: tuple[int, ...] = bounded_each((512, 2048), ge=1)
    kv_tokens: tuple[int | None, ...] = (None,)

    def validate(self) -> None:
        for name in ("quants", "kv_tokens"):
            if not getattr(self, name):
                raise InvalidParameterError(f"{name}: give at least one value", name)
        check_bounds(self)
        if any(k is not None and k < 1 for k in self.kv_tokens):
            raise InvalidParameterError(f"kv_tokens must be >= 1 or auto, got {list(self.kv_tokens)}", "kv_tokens")
        from cinq.quant.variants import one_variant
        for q in self.quants:
            if q != "none":
                one_variant(q)  # one line naming --quant for a bad entry

    def candidates(self) -> list[Candidate]:
        return [Candidate(*c) for c in itertools.product(self.quants, self.spec_ks, self.max_num_seqs,
                                                           self.max_num_batched_tokens, self.kv_tokens)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_list(text: str, name: str, kind: type = int, auto: bool = False) -> tuple[Any, ...]:
    """``a,b,c`` as a tuple of ``kind`` (``auto`` -> None where allowed), or one line naming the flag."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if auto and part == "auto":
            out.append(None)
            continue
        try:
            out.append(kind(part))
        except ValueError:
            raise InvalidParameterError(f"--{name.replace('_', '-')} must be comma-separated {kind.__name__}s"
                                        + (" or auto" if auto else "") + f", got {text!r}", name) from None
    return tuple(out)
