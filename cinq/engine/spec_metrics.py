"""Language tags on requests, and the per-language speculative-decoding counters they label.

A request may carry a short tag (``"de"``, ``"python"``, ...) naming its language; the engine then counts its
drafts and accepted tokens under that tag as well as in the totals, so acceptance (tau) can be compared across
languages. Untagged requests count in the totals only. Tags come from clients, so both their spelling and their
number are bounded: at most ``MAX_LANGUAGE_LEN`` characters of ``[A-Za-z0-9_-]``, and past ``MAX_LANGUAGES``
distinct tags the new ones are counted together under ``OTHER_LANGUAGE`` (a label no tag can spell), which keeps
the engine's memory and the Prometheus label set bounded.
"""

from __future__ import annotations

import re

from cinq.errors import InvalidParameterError
from cinq.outputs import SpecDecodingStats

MAX_LANGUAGE_LEN = 32
MAX_LANGUAGES = 64
OTHER_LANGUAGE = "*"
_LANGUAGE = re.compile(r"[A-Za-z0-9_-]+")


def check_language(language: object, param: str = "language") -> str | None:
    """``language`` if it is a valid tag (or None); else an InvalidParameterError naming ``param``."""
    if language is None:
        return None
    if not isinstance(language, str):
        raise InvalidParameterError(f"{param} must be a string, got {type(language).__name__}", param)
    if not 1 <= len(language) <= MAX_LANGUAGE_LEN or not _LANGUAGE.fullmatch(language):
        raise InvalidParameterError(
            f"{param} must be 1 to {MAX_LANGUAGE_LEN} characters of A-Z, a-z, 0-9, '_' or '-', got "
            f"{language[:MAX_LANGUAGE_LEN + 8]!r}", param)
    return language


def count_language(by_language: dict[str, SpecDecodingStats], language: str, num_draft_tokens: int,
                   num_accepted_tokens: int) -> None:
    """Count one verify step of a sequence tagged ``language`` (a new tag past the cap goes to "*")."""
    stats = by_language.get(language)
    if stats is None:
        if len(by_language) >= MAX_LANGUAGES - (OTHER_LANGUAGE not in by_language):
            language = OTHER_LANGUAGE  # the last slot is kept for "*" itself
        stats = by_language.setdefault(language, SpecDecodingStats())
    stats.observe(num_draft_tokens, num_accepted_tokens)
