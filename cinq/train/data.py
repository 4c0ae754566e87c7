"""Tokenized corpus on disk and the batches the trainers draw from it.

Each split is stored as ``{split}.tokens.npy`` (uint16, every document as ``<|bos|> text <|end|>``, back to
back) and ``{split}.offsets.npy`` (int64 document starts plus the end), aligned with ``{split}.jsonl``.

Training batches are windows of ``seq_len + 1`` tokens at offsets drawn from a generator seeded by
(seed, step): batch ``k`` is the same whether a run got there in one go or resumed from a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cinq.errors import InvalidParameterError
from cinq.train.corpus import SPLITS, read_split
from cinq.train.tokenizer_train import load_tokenizer, special_ids


def encode_documents(tok: Any, texts: list[str]) -> list[list[int]]:
    """``<|bos|> text <|end|>`` token ids per document."""
    ids = special_ids(tok)
    return [[ids["bos"], *e.ids, ids["eos"]] for e in tok.encode_batch(texts, add_special_tokens=False)]


def tokenize_corpus(corpus_dir: str | Path, tokenizer_dir: str | Path) -> dict[str, Any]:
    """Write the token files of every split and add token counts (per source and language) and the tokenizer's
    hash to ``manifest.json``; returns the updated manifest."""
    corpus_dir = Path(corpus_dir)
    tok = load_tokenizer(tokenizer_dir)
    manifest = json.loads((corpus_dir / "manifest.json").read_text())
    for entry in list(manifest["sources"].values()) + list(manifest["languages"].values()):
        entry["tokens"] = dict.fromkeys(SPLITS, 0)
    for split in SPLITS:
        docs = read_split(corpus_dir / f"{split}.jsonl")
        encoded = encode_documents(tok, [d.text for d in docs])
        lengths = np.array([len(e) for e in encoded], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = np.fromiter((t for e in encoded for t in e), dtype=np.uint16, count=int(offsets[-1]))
        np.save(corpus_dir / f"{split}.tokens.npy", flat)
        np.save(corpus_dir / f"{split}.offsets.npy", offsets)
        for d, n in zip(docs, lengths.tolist()):
            # Count the text's own tokens (not the bos/end each document gets).
            manifest["sources"][d.source]["tokens"][split] += n - 2
            manifest["languages"][d.lang]["tokens"][split] += n - 2
    tok_json = Path(tokenizer_dir) / "tokenizer.json" if Path(tokenizer_dir).is_dir() else Path(tokenizer_dir)
    manifest["tokenizer"] = {"vocab_size": tok.get_vocab_size(),
                             "sha256": hashlib.sha256(tok_json.read_bytes()).hexdigest()}
    (corpus_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


@dataclass(slots=True)
class TokenSplit:
    """One tokenized split: the flat token array, document offsets, and each document's language/source."""

    tokens: np.ndarray
    offsets: np.ndarray
    langs: list[str]
    sources: list[str]

    @classmethod
    def load(cls, corpus_dir: str | Path, split: str) -> TokenSplit:
        corpus_dir = Path(corpus_dir)
        if split not in SPLITS:
            raise InvalidParameterError(f"split must be one of {SPLITS}, got {split!r}", "split")
        path = corpus_dir / f"{split}.tokens.npy"
        if not path.is_file():
            raise InvalidParameterError(f"{path} not found: run `cinq data build --out {corpus_dir}` first", "data")
        docs = read_split(corpus_dir / f"{split}.jsonl")
        return cls(np.load(path, mmap_mode="r"), np.load(corpus_dir / f"{split}.offsets.npy"),
                   [d.lang for d in docs], [d.source for d in docs])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def stream(self, lang: str | None = None, source: str | None = None, max_tokens: int | None = None) -> list[int]:
        """The concatenated documents of one language and/or source (whole documents, up to ``max_tokens``)."""
        out: list[int] = []
        for i, (dl, ds) in enumerate(zip(self.langs, self.sources)):
            if (lang is None or dl == lang) and (source is None or ds == source):
                out.extend(self.tokens[self.offsets[i]:self.offsets[i + 1]].tolist())
                if max_tokens is not None and len(out) >= max_tokens:
                    return out[:max_tokens]
        return out

    def languages(self) -> list[str]:
        return sorted(set(self.langs))


class BatchSampler:
    """Random windows of ``seq_len + 1`` tokens; ``batch(step)`` depends only on (seed, step)."""

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int = 0) -> None:
        if len(tokens) < seq_len + 2:
            raise InvalidParameterError(f"seq_len ({seq_len}) must be shorter than the data ({len(tokens)} tokens)",
                                        "seq_len")
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed

    def batch(self, step: int) -> torch.Tensor:
        """[batch_size, seq_len + 1] int64 token windows for ``step``."""
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.batch_size)
        rows = [np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64) for s in starts]
        return torch.from_numpy(np.stack(rows))


class MixedBatchSampler:
    """Rows drawn from several token streams: each row of ``batch(step)`` comes from stream ``i`` with
    probability ``weights[i]`` (normalised), then a random window of it; depends only on (seed, step)."""

    def __init__(self, streams: list[np.ndarray], weights: list[float], batch_size: int, seq_len: int,
                 seed: int = 0) -> None:
        if len(streams) != len(weights) or not streams:
            raise InvalidParameterError("one weight per stream is needed", "weights")
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise InvalidParameterError(f"weights must be >= 0 with a positive sum, got {weights}", "weights")
        self.parts = [BatchSampler(t, 1, seq_len, seed) for t in streams]
        self.p = np.asarray(weights, dtype=np.float64) / sum(weights)
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed

    def batch(self, step: int) -> torch.Tensor:
        """[batch_size, seq_len + 1] int64 token windows for ``step``."""
        rng = np.random.default_rng([self.seed, step, 17])
        which = rng.choice(len(self.parts), size=self.batch_size, p=self.p)
        rows = []
        for i in which.tolist():
            part = self.parts[i]
            start = int(rng.integers(0, len(part.tokens) - self.seq_len - 1))
            rows.append(np.asarray(part.tokens[start:start + self.seq_len + 1], dtype=np.int64))
        return torch.from_numpy(np.stack(rows))


def task_tokens(tokenizer: Any, task: str, n_problems: int, seed: int, split: str = "train") -> np.ndarray:
    """``split`` of the generated ``task`` (e.g. "arithmetic-easy") as one token stream, each problem wrapped in
    BOS ... EOS as the corpus documents are."""
    from cinq.tasks import TASKS, arithmetic_problems
    if task not in TASKS:
        raise InvalidParameterError(f"task must be one of {sorted(TASKS)}, got {task!r}", "task")
    problems = arithmetic_problems(n_problems, seed=seed, split=split, level=TASKS[task])
    return np.asarray([t for doc in encode_documents(tokenizer, [p.text() for p in problems]) for t in doc],
                      dtype=np.int32)


def window_rng(seed: int, step: int, salt: int) -> np.random.Generator:
    """A generator for decisions tied to one step (which batches are on-policy, which CoT examples); ``salt``
    keeps the streams of different decisions apart."""
    return np.random.default_rng([seed, step, salt])
