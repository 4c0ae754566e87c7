"""Greedy decoding of an exported GGUF file in llama.cpp (llama-cpp-python, an optional extra: ``cinq[llama]``),
token ids in and out: the side-by-side baseline of `cinq bench latency` (cinq/bench/latency_engines.py) and the
parity tests of the exporter.

Token ids go in directly (no llama.cpp tokenization), so a comparison with cinq sees the same prompt whatever
the two tokenizers do with text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(slots=True)
class GreedyRun:
    """One greedy generation: the tokens, each token's logits row (if kept) and the seconds of each decode step
    (a step: one token evaluated, its logits read, the argmax taken)."""

    token_ids: list[int]
    prefill_s: float
    step_s: list[float] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)


class LlamaCppGreedy:
    """One llama.cpp context over a GGUF file, ``threads`` threads for prefill and decode."""

    def __init__(self, path: str | Path, threads: int, n_ctx: int = 2048) -> None:
        from llama_cpp import Llama  # optional: callers check for the package first

        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=min(n_ctx, 2048), n_threads=threads,
                         n_threads_batch=threads, logits_all=False, verbose=False)
        self.n_ctx = n_ctx

    def generate(self, prompt_ids: list[int], max_tokens: int, keep_logits: bool = False) -> GreedyRun:
        """Greedy continuation of ``prompt_ids`` (``max_tokens`` tokens, end-of-text ignored)."""
        if len(prompt_ids) + max_tokens > self.n_ctx:
            raise ValueError(f"prompt ({len(prompt_ids)}) + max_tokens ({max_tokens}) exceeds n_ctx {self.n_ctx}")
        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt_ids)
        row = self._last_logits()
        run = GreedyRun(token_ids=[int(row.argmax())], prefill_s=time.perf_counter() - t0)
        if keep_logits:
            run.logits.append(row.copy())
        for _ in range(max_tokens - 1):
            t = time.perf_counter()
            llm.eval([run.token_ids[-1]])
            row = self._last_logits()
            run.token_ids.append(int(row.argmax()))
            run.step_s.append(time.perf_counter() - t)
            if keep_logits:
                run.logits.append(row.copy())
        return run

    def _last_logits(self) -> np.ndarray:
        """A view of llama.cpp's logits for the last evaluated token (valid until the next eval): without
        ``logits_all`` llama-cpp-python keeps no copy of its own."""
        import llama_cpp
        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),))
