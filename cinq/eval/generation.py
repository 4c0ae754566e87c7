"""Greedy completions of text prompts for the evaluations: through the serving engine (what a served model
answers), or without it (an in-memory model, for tests and models that exist only as modules).

Both take the same prompts and stop strings and return the completions' text without the stop string, so the
scorers see the same thing from either. ``EngineGenerator`` keeps one engine for every call on a model folder
(the whole problems, their steps and the batch-1 decode timing share one load).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

# generate(prompts, max_new_tokens, stop strings) -> (completions, generated tokens per second)
GenerateFn = Callable[[list[str], int, Sequence[str]], tuple[list[str], float]]


class EngineGenerator:
    """Greedy generation with one ``LLM`` on ``model_dir`` (paged KV cache, continuous batching, prefix caching:
    the step items of a problem share its prompt)."""

    def __init__(self, model_dir: str | Path, dtype: str = "bfloat16", max_num_seqs: int = 128,
                 tokens_per_seq: int = 256, engine_args: dict[str, Any] | None = None) -> None:
        """``engine_args``: further EngineConfig fields (a served configuration: attention backend, speculative
        decoding ...); they win over the sizes chosen here."""
        from cinq import LLM
        self.model_dir = Path(model_dir)
        # KV blocks for max_num_seqs sequences of tokens_per_seq (prompt + completion): longer ones still run,
        # the scheduler preempts when the cache is full.
        blocks = max_num_seqs * math.ceil(tokens_per_seq / 16) + 16
        args = {"dtype": dtype, "max_num_seqs": max_num_seqs, "num_kv_blocks": blocks, **(engine_args or {})}
        self.llm = LLM(str(model_dir), engine_core="inproc", **args)  # the scorer reads llm.engine.model

    def __call__(self, prompts: list[str], max_new_tokens: int, stop: Sequence[str] = ()) -> tuple[list[str], float]:
        from cinq import SamplingParams
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop=list(stop) or None)
        start = time.perf_counter()
        outs = self.llm.generate(prompts, params)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return [o.outputs[0].text for o in outs], tokens / max(seconds, 1e-9)

    def kernels(self) -> list[str]:
        """The kernel kinds of the served decoder linears (``dense`` for unquantized ones), sorted."""
        model = self.llm.engine.model
        head = getattr(model, "lm_head", None)
        return sorted({getattr(m, "kind", "dense") for m in model.modules()
                       if type(m).__name__.endswith("Linear") and m is not head})

    def decode_tokens_per_s(self, prompt_ids: list[int], new_tokens: int = 64, repeats: int = 3) -> float:
        """Batch-1 decode speed (cinq.engine.token_times, the prefill step excluded): median of ``repeats``
        runs after one warm-up run."""
        from cinq.engine.token_times import time_greedy_request
        rates = [time_greedy_request(self.llm.engine, prompt_ids, new_tokens).decode_tokens_per_s
                 for _ in range(repeats + 1)]
        return statistics.median(rates[1:])


class NaiveGenerator:
    """Greedy generation without the engine: batched full recomputation per token (right padding is harmless
    under causal attention). Quadratic in length: for small models and tests."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 32) -> None:
        self.model, self.tok, self.batch_size = model, tokenizer, batch_size

    @classmethod
    def from_folder(cls, model_dir: str | Path, dtype: str = "float32", model: Any = None) -> NaiveGenerator:
        """For a model folder (its tokenizer; ``model``: an already loaded module to use instead of loading)."""
        from cinq.model.loader import load_model
        from cinq.model.tokenizer import Tokenizer
        return cls(model if model is not None else load_model(model_dir, dtype=dtype),
                   Tokenizer.from_pretrained(model_dir))

    def __call__(self, prompts: list[str], max_new_tokens: int, stop: Sequence[str] = ()) -> tuple[list[str], float]:
        start, generated, texts = time.perf_counter(), 0, []
        for b in range(0, len(prompts), self.batch_size):
            chunk, n = self._batch(prompts[b:b + self.batch_size], max_new_tokens, stop)
            texts += chunk
            generated += n
        return texts, generated / max(time.perf_counter() - start, 1e-9)

    def _batch(self, prompts: list[str], max_new_tokens: int, stop: Sequence[str]) -> tuple[list[str], int]:
        eos = set(self.tok.eos_token_ids)
        seqs = [self.tok.encode(p) for p in prompts]
        starts = [len(s) for s in seqs]
        done = [False] * len(seqs)
        generated = 0
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                live = [i for i, d in enumerate(done) if not d]
                if not live:
                    break
                width = max(len(seqs[i]) for i in live)
                ids = torch.zeros(len(live), width, dtype=torch.long)
                for row, i in enumerate(live):
                    ids[row, :len(seqs[i])] = torch.tensor(seqs[i])
                hidden = self.model(ids.to(device))
                last = torch.tensor([len(seqs[i]) - 1 for i in live], device=device)
                nxt = self.model.compute_logits(hidden[torch.arange(len(live), device=device), last]).argmax(-1)
                for i, t in zip(live, nxt.tolist()):
                    seqs[i].append(t)
                    generated += 1
                    if t in eos or any(s in self.tok.decode(seqs[i][starts[i]:]) for s in stop):
                        done[i] = True
        self.model.train(was_training)
        return [_cut(self.tok.decode(s[st:]), stop) for s, st in zip(seqs, starts)], generated


def _cut(text: str, stop: Sequence[str]) -> str:
    """``text`` up to its first stop string (the engine leaves stop strings out of the output too)."""
    ends = [text.find(s) for s in stop if s in text]
    return text[:min(ends)] if ends else text
