"""Does a request's output change with its batch mates? Greedy generation of target prompts alone, then inside
batches of other requests (two different sets of mates per batch size), each compared token by token with the
target's solo output. Under continuous batching a quantization scheme whose activation scales span the batch
(or a GEMM whose reduction order depends on the row count) makes a request's answer depend on who else is
running; one whose scales are per token or fixed (SmoothQuant dynamic per token, static per tensor) need not."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from cinq.config import EngineConfig


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def batch_mates(config: EngineConfig, targets: list[list[int]], pool: list[list[int]], batch_sizes: tuple[int, ...],
                max_tokens: int, seed: int = 0) -> list[dict[str, Any]]:
    """One row per batch size: how many (target, mate set) pairs produced output different from the target
    alone, and where they first diverged."""
    from cinq.engine.llm import LLM
    from cinq.sampling_params import SamplingParams
    llm = LLM(config.model, **{f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                               if f.name not in ("model", "parallel_config")})
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    solo = [list(llm.generate([t], params)[0].outputs[0].token_ids) for t in targets]
    rng = random.Random(seed)
    rows = []
    for b in batch_sizes:
        differ, positions, pairs = 0, [], 0
        for _ in range(2):  # two different sets of mates
            for t, alone in zip(targets, solo):
                mates = rng.sample(pool, b - 1)
                at = rng.randrange(b)
                batch = mates[:at] + [t] + mates[at:]
                out = list(llm.generate(batch, params)[at].outputs[0].token_ids)
                pairs += 1
                pos = first_divergence(alone, out)
                if pos is not None:
                    differ += 1
                    positions.append(pos)
        rows.append({"batch": b, "pairs": pairs, "differ": differ,
                     "mean_first_divergence": sum(positions) / len(positions) if positions else None})
    return rows
