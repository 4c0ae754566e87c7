"""Benchmark inputs: random token-id requests (throughput, serving) and token windows of shipped text (prefix
caching, speculative decoding), tokenized with the model's own tokenizer."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from cinq.errors import InvalidParameterError


@dataclass(slots=True)
class BenchRequest:
    """One request of a workload: prompt token ids and how many tokens to generate (ignore_eos)."""

    prompt: list[int]
    output_len: int


def random_requests(n: int, vocab_size: int, prompt_lens: tuple[int, int], output_lens: tuple[int, int],
                    seed: int, low_token: int = 0) -> list[BenchRequest]:
    """``n`` requests of random token ids in [low_token, vocab_size), prompt and output lengths uniform in the
    inclusive ranges given."""
    for name, (lo, hi) in (("input_len", prompt_lens), ("output_len", output_lens)):
        if not 1 <= lo <= hi:
            raise InvalidParameterError(f"{name} range must satisfy 1 <= low <= high, got [{lo}, {hi}]", name)
    rng = random.Random(seed)
    low = low_token if low_token < vocab_size else 0
    return [BenchRequest([rng.randrange(low, vocab_size) for _ in range(rng.randint(*prompt_lens))],
                         rng.randint(*output_lens)) for _ in range(n)]


def around(length: int) -> tuple[int, int]:
    """The range [length/2, 3*length/2] (at least 1) that ``vllm bench``-style random workloads draw from."""
    return max(length // 2, 1), max(length * 3 // 2, 1)


def text_tokens(tokenizer: object, text: str | Path = "held-out") -> list[int]:
    """A shipped text (``held-out``, ``calibration``) or a file, as one token stream of the model's tokenizer."""
    from cinq.assets.text import resolve_text_path
    path = resolve_text_path(text)
    ids = tokenizer.encode(path.read_text(encoding="utf-8"), add_special_tokens=False)  # type: ignore[attr-defined]
    if not ids:
        raise InvalidParameterError(f"text {str(text)!r} holds no tokens", "text")
    return ids


class TokenWindows:
    """Consecutive windows of a token stream, wrapping around at its end (each window is a fresh piece of text
    until the stream is used up)."""

    def __init__(self, tokens: list[int], start: int = 0) -> None:
        self.tokens = tokens
        self.pos = start % len(tokens)

    def take(self, n: int) -> list[int]:
        """The next ``n`` tokens."""
        out: list[int] = []
        while len(out) < n:
            chunk = self.tokens[self.pos:self.pos + n - len(out)]
            out += chunk
            self.pos = (self.pos + len(chunk)) % len(self.tokens)
        return out
