"""Sequence-level KD data: the teacher continues short corpus prompts with cinq's engine; the continuations,
back to back, form the token stream the student trains on (cached in the run folder)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from cinq.errors import InvalidParameterError
from cinq.train.data import TokenSplit
from cinq.train.generation import generate_naive, generate_with_engine

log = logging.getLogger(__name__)


def _document_prompt(split: TokenSplit, d: int, max_prompt: int) -> list[int]:
    """The first tokens of document ``d`` (bos included, at most ``max_prompt``, a quarter of a short one)."""
    start, end = int(split.offsets[d]), int(split.offsets[d + 1])
    k = max(2, min(max_prompt, (end - start) // 4))
    return split.tokens[start:start + k].astype(np.int64).tolist()


# How prompts are spread over the languages (``mixed_prompts``): the same number per language, the corpus split's own
# document proportions, or English alone (what a head trained on the usual English chat sets sees).
PROMPT_MIXES = ("balanced", "natural", "english")


def natural_prompts(data_dir: str | Path, n: int, seed: int, max_prompt: int = 16, split: str = "train"
                    ) -> list[tuple[str, list[int]]]:
    """``n`` (language, prompt) pairs: the first tokens (bos included, at most ``max_prompt``, a quarter of the
    document when it is short) of documents of ``split`` drawn without replacement by ``seed``, so the languages
    come in the split's natural document proportions."""
    docs = TokenSplit.load(data_dir, split)
    n_docs = len(docs.offsets) - 1
    rng = np.random.default_rng([seed, 7])
    picks = rng.choice(n_docs, size=min(n, n_docs), replace=False)
    return [(docs.langs[d], _document_prompt(docs, d, max_prompt)) for d in picks.tolist()]


def corpus_prompts(data_dir: str | Path, n: int, seed: int, max_prompt: int = 16) -> list[list[int]]:
    """The prompts of ``natural_prompts`` over the train split (languages dropped)."""
    return [p for _, p in natural_prompts(data_dir, n, seed, max_prompt)]


def balanced_prompts(data_dir: str | Path, n: int, seed: int, max_prompt: int = 16, split: str = "train"
                     ) -> list[tuple[str, list[int]]]:
    """About ``n`` (language, prompt) pairs, as ``corpus_prompts`` but the same number from every language of
    ``split`` (fewer from a language with fewer documents), in language order."""
    docs = TokenSplit.load(data_dir, split)
    langs = docs.languages()
    per_lang = max(1, n // max(1, len(langs)))
    return [pair for li, lang in enumerate(langs) for pair in _language_prompts(docs, lang, per_lang, [seed, 7, li],
                                                                                  max_prompt)]


def _language_prompts(docs: TokenSplit, lang: str, n: int, rng_key: list[int], max_prompt: int
                      ) -> list[tuple[str, list[int]]]:
    """``n`` (or all, when fewer) documents of ``lang`` drawn without replacement by ``rng_key``, as prompts."""
    ids = np.flatnonzero(np.array(docs.langs) == lang)
    picks = np.random.default_rng(rng_key).choice(ids, size=min(n, len(ids)), replace=False)
    return [(lang, _document_prompt(docs, int(d), max_prompt)) for d in picks.tolist()]


def mixed_prompts(data_dir: str | Path, n: int, seed: int, max_prompt: int = 16, split: str = "train",
                  mix: str = "balanced") -> list[tuple[str, list[int]]]:
    """(language, prompt) pairs in ``mix``: ``balanced`` is ``balanced_prompts``; ``natural`` draws as many
    prompts as that would (so the mixes hold the same number) with ``natural_prompts``; ``english`` as many from
    the split's English documents (fewer when it has fewer)."""
    if mix not in PROMPT_MIXES:
        raise InvalidParameterError(f"prompt mix must be one of {list(PROMPT_MIXES)}, got {mix!r}", "prompt_mix")
    pairs = balanced_prompts(data_dir, n, seed, max_prompt, split)
    if mix == "natural":
        return natural_prompts(data_dir, len(pairs), seed, max_prompt, split)
    if mix == "english":
        english = _language_prompts(TokenSplit.load(data_dir, split), "en", len(pairs), [seed, 7, 0], max_prompt)
        if not english:
            raise InvalidParameterError(f"prompt_mix english: the {split} split has no English (en) documents",
                                        "prompt_mix")
        return english
    return pairs


def teacher_token_stream(distiller: Any, n: int, max_tokens: int, cache: Path) -> np.ndarray:
    """The teacher-written stream (uint16), generated once and cached at ``cache``."""
    if cache.is_file():
        return np.load(cache)
    job = distiller.job
    prompts = corpus_prompts(job.data_dir, n, job.seed)
    eos = distiller.ids["eos"]
    t0 = time.perf_counter()
    if job.generator == "engine":
        outs = generate_with_engine(distiller.teacher_dir, prompts, max_tokens, job.sample_temperature, job.seed,
                                    dtype="bfloat16")
    else:
        outs = generate_naive(distiller.teacher, prompts, max_tokens, job.sample_temperature, job.seed, [eos])
    elapsed = time.perf_counter() - t0
    seqs = [p + o + ([eos] if not o or o[-1] != eos else []) for p, o in zip(prompts, outs)]
    stream = np.fromiter((t for s in seqs for t in s), dtype=np.uint16)
    log.info("seq-KD: teacher wrote %d tokens for %d prompts in %.0f s (%.0f tokens/s)",
             sum(len(o) for o in outs), len(prompts), elapsed, sum(len(o) for o in outs) / max(elapsed, 1e-9))
    np.save(cache, stream)
    return stream
