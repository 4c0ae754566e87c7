"""The shipped held-out text split by language, for quality columns that report per language (KL to bf16 of a
quantized model whose static activation scales were calibrated on one mix of languages).

The shipped texts (``cinq.assets.text``) are records of ten sources interleaved, without their language tags (the
corpus that has them is not shipped). ``record_language`` tells the languages apart by script and common words:
Cyrillic is ru, Han is zh, arithmetic records are cinq's word problems, code is what ``mixed_workload.classify``
calls code; among the Latin-script languages each language's diacritics and most frequent words vote, and a
record with no vote is en (the largest share). It is a heuristic: a short fortune may be put under the wrong
language, which moves a few tokens between rows and changes no model's score."""

from __future__ import annotations

import re
from typing import Any

from cinq.bench.mixed_workload import classify
from cinq.errors import InvalidParameterError

LANGUAGES = ("en", "de", "es", "it", "pl", "cs", "ru", "zh", "code", "arithmetic")
_CYRILLIC = re.compile(r"[\u0400-\u04ff]")
_HAN = re.compile(r"[\u4e00-\u9fff]")
_WORD = re.compile(r"[^\W\d_]+")
# letters only one of the Latin-script languages uses, and its most frequent short words
_LETTERS = {"de": "äöüß", "es": "ñ¿¡", "pl": "łąęśźżń", "cs": "řěůťď", "it": "àèìòù", "en": ""}
_WORDS = {
    "en": {"the", "and", "of", "to", "is", "you", "that", "it", "in", "for", "with", "not", "be", "are", "he"},
    "de": {"der", "die", "das", "und", "ist", "nicht", "ein", "eine", "ich", "sie", "zu", "mit", "den", "es"},
    "es": {"el", "la", "los", "las", "que", "y", "de", "en", "es", "por", "con", "del", "se", "una", "para"},
    "it": {"il", "di", "che", "è", "non", "un", "per", "sono", "della", "gli", "ma", "nel", "più", "anche", "ho"},
    "pl": {"nie", "się", "jest", "w", "na", "z", "że", "jak", "co", "ale", "tak", "po", "już", "czy", "być"},
    "cs": {"je", "se", "na", "v", "že", "není", "jsem", "jak", "ale", "který", "pro", "když", "jsou", "aby"},
}


def record_language(record: str) -> str:
    """One of ``LANGUAGES`` for one record of the shipped text (see the module docstring)."""
    kind = classify(record)
    if kind != "chat":
        return kind
    cyrillic, han = len(_CYRILLIC.findall(record)), len(_HAN.findall(record))
    if cyrillic or han:
        return "ru" if cyrillic >= han else "zh"
    lower = record.lower()
    words = _WORD.findall(lower)
    votes = {lang: 3 * sum(lower.count(c) for c in letters) + sum(w in _WORDS[lang] for w in words)
             for lang, letters in _LETTERS.items()}
    best = max(votes, key=lambda lang: votes[lang])
    return best if votes[best] > votes["en"] else "en"


def language_records(text: str = "held-out") -> dict[str, list[str]]:
    """The records (blank-line separated) of a shipped text or file, grouped by ``record_language``, in
    ``LANGUAGES`` order; languages with no record are left out."""
    from cinq.assets.text import resolve_text_path
    path = resolve_text_path(text)
    if not path.is_file():
        raise InvalidParameterError(f"text {text!r} is neither a shipped text nor a file", "text")
    groups: dict[str, list[str]] = {lang: [] for lang in LANGUAGES}
    for record in path.read_text(encoding="utf-8").split("\n\n"):
        if record.strip():
            groups[record_language(record)].append(record)
    return {lang: recs for lang, recs in groups.items() if recs}


def language_token_ids(tokenizer: Any, max_tokens: int, text: str = "held-out") -> dict[str, list[int]]:
    """Per language, the first ``max_tokens`` tokens of its records joined by blank lines (with the tokenizer's
    special tokens, as perplexity is scored)."""
    from cinq.eval.perplexity import encode_text
    if max_tokens < 2:
        raise InvalidParameterError(f"max_tokens must be >= 2, got {max_tokens}", "max_tokens")
    return {lang: encode_text(tokenizer, "\n\n".join(recs))[:max_tokens]
            for lang, recs in language_records(text).items()}
