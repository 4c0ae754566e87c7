"""Build the training corpus: documents from the sources, synthetic reasoning data, exact deduplication, a
train/validation/test split by document, per-source caps, and a manifest.

Determinism: documents are ordered, split and capped by hashes of their text, never by time or set order, so
the same inputs give the same bytes in ``{split}.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cinq.tasks import arithmetic_problems
from cinq.train.sources import Document, Source, iter_documents, package_version

SPLITS = ("train", "validation", "test")
CHAT_REQUESTS = {"en": "Tell me a fortune.", "de": "Erzähl mir einen Spruch.", "es": "Dime un refrán.",
                 "it": "Dimmi una massima.", "ru": "Расскажи мне афоризм."}


@dataclass(frozen=True, slots=True)
class CorpusSettings:
    """Sizes of the parts that are not read from packages, and the held-out caps."""

    arithmetic_train: int = 10_000
    # Easy-level problems (train split only: the held-out arithmetic-easy benchmark draws its own test split),
    # so that the shipped teacher can do the reasoning the quantization study judges.
    arithmetic_easy_train: int = 30_000
    arithmetic_eval: int = 300  # problems per validation / test split
    chat_arithmetic: int = 4_000  # train problems rendered as chat turns (another seed than the plain ones)
    chat_fortunes: int = 400  # fortunes per language rendered as chat turns
    eval_cap: int = 60_000  # bytes per source kept in validation and in test (keeps evaluation quick)
    seed: int = 0


def text_hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def split_of(text: str) -> str:
    """90% train, 5% validation, 5% test, by a hash of the text."""
    bucket = int.from_bytes(text_hash(text)[:4], "little") % 100
    return "train" if bucket < 90 else "validation" if bucket < 95 else "test"


def _dedup_key(text: str) -> bytes:
    return hashlib.sha1(" ".join(text.split()).encode("utf-8")).digest()


def _cap(docs: list[Document], cap: int | None) -> list[Document]:
    """Keep documents in hash order while they fit ``cap`` bytes (all when cap is None)."""
    docs = sorted(docs, key=lambda d: text_hash(d.text))
    if cap is None:
        return docs
    out, used = [], 0
    for d in docs:
        size = len(d.text.encode("utf-8"))
        if used + size > cap:
            continue
        out.append(d)
        used += size
    return out


def chat_text(user: str, reply: str) -> str:
    """One chat exchange in cinq's chat template (the bos is added at tokenization, like every document's)."""
    from jinja2 import Template

    from cinq.model.byte_tokenizer import CHAT_TEMPLATE
    prompt = Template(CHAT_TEMPLATE).render(messages=[{"role": "user", "content": user}], bos_token="",
                                            add_generation_prompt=True)
    return prompt + reply + "<|end|>"


def synthetic_documents(settings: CorpusSettings, fortunes_train: Iterable[Document]) -> dict[str, list[Document]]:
    """Arithmetic problems (each task split to the same corpus split) and chat-formatted examples (train only)."""
    out: dict[str, list[Document]] = {s: [] for s in SPLITS}
    for split in SPLITS:
        n = settings.arithmetic_train if split == "train" else settings.arithmetic_eval
        for i, p in enumerate(arithmetic_problems(n, seed=settings.seed, split=split)):
            out[split].append(Document(p.text(), "math", "arithmetic", f"{split}#{i}"))
    for i, p in enumerate(arithmetic_problems(settings.arithmetic_easy_train, seed=settings.seed, split="train",
                                              level="easy")):
        out["train"].append(Document(p.text(), "math", "arithmetic-easy", f"train#{i}"))
    for i, p in enumerate(arithmetic_problems(settings.chat_arithmetic, seed=settings.seed + 1, split="train")):
        out["train"].append(Document(chat_text(p.question, p.target()), "chat", "chat", f"arithmetic#{i}"))
    by_lang: dict[str, list[Document]] = {}
    for d in fortunes_train:
        if d.lang in CHAT_REQUESTS and len(d.text) < 400:
            by_lang.setdefault(d.lang, []).append(d)
    for lang in sorted(by_lang):
        for d in sorted(by_lang[lang], key=lambda d: text_hash(d.text))[:settings.chat_fortunes]:
            out["train"].append(Document(chat_text(CHAT_REQUESTS[lang], d.text), "chat", "chat", f"{lang}:{d.ref}"))
    return out


def collect(sources: list[Source], settings: CorpusSettings) -> tuple[dict[str, list[Document]], dict[str, Any]]:
    """All documents by split (deduplicated, capped, in a fixed order) and per-source statistics."""
    seen: set[bytes] = set()
    by_split: dict[str, list[Document]] = {s: [] for s in SPLITS}
    stats: dict[str, Any] = {}
    fortunes_train: list[Document] = []
    for src in sources:
        parts: dict[str, list[Document]] = {s: [] for s in SPLITS}
        read = dupes = 0
        for doc in iter_documents(src):
            read += 1
            key = _dedup_key(doc.text)
            if key in seen:
                dupes += 1
                continue
            seen.add(key)
            parts[split_of(doc.text)].append(doc)
        kept = {"train": _cap(parts["train"], src.train_cap),
                "validation": _cap(parts["validation"], settings.eval_cap),
                "test": _cap(parts["test"], settings.eval_cap)}
        for s in SPLITS:
            by_split[s].extend(kept[s])
        if src.kind == "fortune":
            fortunes_train.extend(kept["train"])
        stats[src.name] = {
            "package": src.package, "package_version": package_version(src.package) if src.files is None else None,
            "lang": src.lang, "kind": src.kind, "documents_read": read, "duplicates_removed": dupes,
            "train_cap_bytes": src.train_cap,
        }
    for s, docs in synthetic_documents(settings, fortunes_train).items():
        by_split[s].extend(docs)
    return by_split, stats


def write_split(path: Path, docs: list[Document]) -> str:
    """Write one JSON line per document; returns the file's sha256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for d in docs:
            line = (json.dumps({"text": d.text, "lang": d.lang, "source": d.source, "ref": d.ref},
                               ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
            f.write(line)
            h.update(line)
    return h.hexdigest()


def read_split(path: str | Path) -> list[Document]:
    """The documents of a ``{split}.jsonl`` file."""
    docs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            docs.append(Document(r["text"], r["lang"], r["source"], r["ref"]))
    return docs


def build_corpus(sources: list[Source], out: str | Path, settings: CorpusSettings | None = None) -> dict[str, Any]:
    """Write ``train/validation/test.jsonl`` and ``manifest.json`` (bytes per source, language and split) into
    ``out``; returns the manifest. Token counts are added once a tokenizer exists (``data.tokenize_corpus``)."""
    settings = settings or CorpusSettings()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    by_split, stats = collect(sources, settings)
    files = {s: write_split(out / f"{s}.jsonl", by_split[s]) for s in SPLITS}
    for src in list(stats) + ["arithmetic", "arithmetic-easy", "chat"]:
        stats.setdefault(src, {"package": None, "package_version": None, "kind": "synthetic"})
        for s in SPLITS:
            docs = [d for d in by_split[s] if d.source == src]
            stats[src].setdefault("documents", {})[s] = len(docs)
            stats[src].setdefault("bytes", {})[s] = sum(len(d.text.encode("utf-8")) for d in docs)
    langs: dict[str, dict[str, Any]] = {}
    for s in SPLITS:
        for d in by_split[s]:
            entry = langs.setdefault(d.lang, {"documents": dict.fromkeys(SPLITS, 0), "bytes": dict.fromkeys(SPLITS, 0)})
            entry["documents"][s] += 1
            entry["bytes"][s] += len(d.text.encode("utf-8"))
    manifest = {
        "format": "cinq-corpus/1",
        "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
        "sources": stats,
        "languages": dict(sorted(langs.items())),
        "sha256": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest
