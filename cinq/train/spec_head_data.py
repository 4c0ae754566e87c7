"""What speculative heads learn from and are measured on: sequences the served target wrote itself.

DistillSpec's lesson (Zhou et al. 2024): a drafter should be aligned to the target on the target's own outputs,
since those are what it drafts for. The target continues prompts drawn from the corpus, by default the same
number from every corpus language (``prompt_mix`` balanced; natural: in the split's own document proportions,
as many in total; english: as many, all English; cinq/train/seqkd.py ``mixed_prompts``), with cinq's own serving
engine
(cinq/train/generation.py); each sequence is kept whole (prompt + continuation, positions from 0 as served).
A set is cached in the run folder under a key of everything that produced it (target, corpus, split, prompt mix,
sampling settings), so a rerun reuses it and any change regenerates it. A quantized target is its own target
(``sequences_identity``): its sequences and features are its own, not those of the model it was quantized from.

Training sets sample from the target (``temperature``); held-out sets are its greedy continuations of prompts
from the corpus test split, which neither the target nor the heads trained on.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cinq.train.generated_cache import settings_key
from cinq.train.generation import generate_naive, generate_with_engine
from cinq.train.seqkd import mixed_prompts
from cinq.train.spec_head_prompts import chat_identity, chat_prompts, is_chat_source

log = logging.getLogger(__name__)


@dataclass(slots=True)
class GenerationSettings:
    """How one set of target sequences is made."""

    split: str
    num_prompts: int
    max_prompt: int
    max_tokens: int
    temperature: float
    seed: int
    generator: str = "engine"  # engine: cinq's serving engine; naive: in-memory sampling (tests)
    dtype: str = "bfloat16"  # the engine's compute dtype
    prompt_mix: str = "balanced"  # balanced / natural (the split's proportions) / english (all English)

    def key(self, target_fingerprint: str, corpus: dict[str, Any]) -> str:
        settings = asdict(self)
        if self.prompt_mix == "balanced":  # keyed as before the option existed, so older caches still match
            del settings["prompt_mix"]
        return settings_key({"settings": settings, "target": target_fingerprint, "corpus": corpus})


@dataclass(slots=True)
class TargetSequences:
    """Sequences back to back: ``tokens[offsets[i]:offsets[i + 1]]`` is sequence i, whose first
    ``prompt_lens[i]`` tokens are its prompt; ``langs[i]`` its corpus language."""

    tokens: np.ndarray  # uint16
    offsets: np.ndarray  # int64 [N + 1]
    prompt_lens: np.ndarray  # int64 [N]
    langs: np.ndarray  # str [N]
    info: dict[str, Any] = field(default_factory=dict)  # how the set was generated (its cache's sidecar)

    def __len__(self) -> int:
        return len(self.prompt_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    @classmethod
    def from_lists(cls, seqs: list[list[int]], prompt_lens: list[int], langs: list[str]) -> TargetSequences:
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
        flat = np.fromiter((t for s in seqs for t in s), dtype=np.uint16, count=int(offsets[-1]))
        return cls(flat, offsets, np.asarray(prompt_lens, dtype=np.int64), np.asarray(langs, dtype=str))

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, tokens=self.tokens, offsets=self.offsets, prompt_lens=self.prompt_lens, langs=self.langs)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> TargetSequences:
        with np.load(path, allow_pickle=False) as f:
            return cls(f["tokens"], f["offsets"], f["prompt_lens"], f["langs"])

    def padded(self, rows: list[int], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequences ``rows`` as [B, L] int64 (padded at the end with ``pad``) and their lengths [B]."""
        lengths = [int(self.offsets[i + 1] - self.offsets[i]) for i in rows]
        out = torch.full((len(rows), max(lengths)), pad, dtype=torch.long)
        for r, i in enumerate(rows):
            out[r, :lengths[r]] = torch.from_numpy(self.sequence(i).astype(np.int64))
        return out, torch.tensor(lengths, dtype=torch.long)


def corpus_identity(data_dir: str | Path) -> dict[str, Any]:
    """What names the corpus in a cache key: its splits' and tokenizer's hashes from the manifest (for the chat
    prompts, a hash of their text)."""
    if is_chat_source(data_dir):
        return chat_identity()
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    return {"sha256": manifest.get("sha256"), "tokenizer": manifest.get("tokenizer")}


def target_sequences(target_dir: str | Path, target: Any, data_dir: str | Path, settings: GenerationSettings,
                     cache_dir: str | Path, target_fingerprint: str, eos_ids: list[int]) -> TargetSequences:
    """The target's sequences for ``settings``: from the cache in ``cache_dir`` when its key matches, else
    generated (``target_dir`` through the engine, or the in-memory ``target`` with the naive generator) and
    cached (runs sharing ``cache_dir`` with the same settings generate once)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = settings.key(target_fingerprint, corpus_identity(data_dir))
    path = cache_dir / f"target-{settings.split}-{key}.npz"
    sidecar = path.with_suffix(".json")
    if path.is_file():
        seqs = TargetSequences.load(path)
        seqs.info = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
        return seqs
    pairs = prompt_pairs(target_dir, data_dir, settings)
    prompts = [p for _, p in pairs]
    t0 = time.perf_counter()
    if settings.generator == "engine":
        # every prompt in one wave: a step costs far less than twice a half-full one
        outs = generate_with_engine(target_dir, prompts, settings.max_tokens, settings.temperature, settings.seed,
                                    dtype=settings.dtype, max_num_seqs=min(len(prompts), 256))
    else:
        outs = generate_naive(target, prompts, settings.max_tokens, settings.temperature, settings.seed, eos_ids)
    elapsed = time.perf_counter() - t0
    n_new = sum(len(o) for o in outs)
    log.info("spec heads: the target wrote %d tokens for %d %s prompts in %.0f s (%.0f tokens/s)", n_new,
             len(prompts), settings.split, elapsed, n_new / max(elapsed, 1e-9))
    seqs = TargetSequences.from_lists([p + o for p, o in zip(prompts, outs)], [len(p) for p in prompts],
                                      [lang for lang, _ in pairs])
    seqs.info = {"settings": asdict(settings), "target": target_fingerprint, "sequences": len(seqs),
                 "tokens": seqs.num_tokens, "generated_tokens": n_new, "elapsed_s": elapsed}
    seqs.save(path)
    sidecar.write_text(json.dumps(seqs.info, indent=1) + "\n")
    return seqs


def prompt_pairs(target_dir: str | Path, data_dir: str | Path, settings: GenerationSettings
                 ) -> list[tuple[str, list[int]]]:
    """(language, prompt) pairs for ``settings``: corpus documents' openings, or (``data_dir`` "chat") chat turns
    rendered with the target's template (cinq/train/spec_head_prompts.py; balanced or English)."""
    if is_chat_source(data_dir):
        from cinq.model.tokenizer import Tokenizer
        return chat_prompts(Tokenizer.from_pretrained(target_dir), settings.num_prompts, settings.seed,
                            settings.max_prompt, settings.split, settings.prompt_mix)
    return mixed_prompts(data_dir, settings.num_prompts, settings.seed, settings.max_prompt, settings.split,
                         settings.prompt_mix)


def sequences_identity(target_dir: str | Path, target: Any, fingerprint: str) -> str:
    """The target part of a cached set's key: the head's target fingerprint (an embedding probe), and for a
    quantized target also a hash of its weights. Quantized copies keep the model's embeddings, so the probe alone
    would hand an int4 target's run (sharing ``generated_dir``) the sequences its bf16 source wrote. Dense
    targets keep the probe alone, so caches made before quantized targets were told apart still match."""
    if not target.config.quantization_config:
        return fingerprint
    from cinq.cache import content_hash
    return f"{fingerprint}+{content_hash(Path(target_dir))[:16]}"


class SequenceSampler:
    """``batch(step)``: ``batch_size`` whole sequences drawn by (seed, step), so a resumed run draws the same."""

    def __init__(self, seqs: TargetSequences, batch_size: int, seed: int) -> None:
        self.seqs = seqs
        self.batch_size = batch_size
        self.seed = seed

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step, 11])
        rows = rng.choice(len(self.seqs), size=min(self.batch_size, len(self.seqs)), replace=False)
        return self.seqs.padded(sorted(rows.tolist()))
