"""The most UTF-8 bytes a prompt of ``max_model_len`` tokens can spell, so that a text longer than that is refused
before it is tokenized: tokenizing megabytes takes seconds of CPU, and a prompt that cannot fit the context gets a
400 after it anyway.

The bound is ``max_model_len`` times the most bytes one token can stand for. A vocabulary string spells its bytes
with at least one byte each (byte-level BPE: one character per byte; SentencePiece: ``▁`` for a space,
``<0x41>`` for a byte), so the longest string bounds what a token covers; a normalizer that can shorten the text
(Unicode compatibility forms, lower-casing: at most 4 bytes to 1; a string ``Replace``) multiplies it. Where no
such bound exists — a normalizer or pre-tokenizer that drops text (``Strip``, ``StripAccents``, BERT's,
SentencePiece's precompiled charsmap, splitting on whitespace), an unknown token that swallows any run of
unknown characters, an added token that eats the whitespace around it, a model kind other than BPE — there is
no byte bound and every prompt is tokenized, as before.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

log = logging.getLogger(__name__)

# Bytes of input that one byte of normalized text can stand for, per normalizer kind: NFKC maps a 4-byte
# mathematical letter to 1-byte ASCII, NFC composes 3 Hangul jamo (9 bytes) into one syllable (3), lower-casing
# turns the 3-byte Kelvin sign into "k". Kinds not listed (Strip, StripAccents, Bert, Precompiled, Nmt, ...) can
# drop text without limit.
_SHRINK = {"NFC": 4, "NFD": 4, "NFKC": 4, "NFKD": 4, "Lowercase": 4, "Prepend": 1, "ByteLevel": 1}
# Pre-tokenizers that keep every character (splitting only); "Removed" behaviours drop the delimiters they split on.
_KEEPING_PRE = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation", "UnicodeScripts"}
_MAX_CHAR_BYTES = 4  # one unknown character, mapped to the unknown token


def _normalizer_shrink(node: dict[str, Any] | None) -> float | None:
    """How many input bytes one normalized byte can come from (None: unbounded)."""
    if node is None:
        return 1
    kind = node.get("type")
    if kind == "Sequence":
        factor: float = 1
        for child in node.get("normalizers", []):
            f = _normalizer_shrink(child)
            if f is None:
                return None
            factor *= f
        return factor
    if kind == "Replace":
        pattern, content = node.get("pattern", {}).get("String"), node.get("content", "")
        if pattern is None or not content:  # a regex can match any run; an empty replacement deletes
            return None
        return max(1.0, len(pattern.encode()) / len(content.encode()))
    return _SHRINK.get(kind)


def _pre_tokenizer_keeps_text(node: dict[str, Any] | None) -> bool:
    if node is None:
        return True
    if node.get("type") == "Sequence":
        return all(_pre_tokenizer_keeps_text(child) for child in node.get("pretokenizers", []))
    return node.get("type") in _KEEPING_PRE and node.get("behavior") != "Removed"


def _uses_byte_level(node: dict[str, Any] | None) -> bool:
    if node is None:
        return False
    if node.get("type") == "Sequence":
        return any(_uses_byte_level(child) for child in node.get("pretokenizers", []))
    return node.get("type") == "ByteLevel"


def _state(component: Any) -> dict[str, Any] | None:
    # The binding pickles each component as its tokenizer.json entry; that is the one way to read its settings.
    return json.loads(component.__getstate__()) if component is not None else None


def max_token_bytes(tok: HFTokenizer) -> float | None:
    """The most input bytes one token of ``tok`` can stand for; None when nothing bounds it."""
    model = tok.model
    if type(model).__name__ != "BPE":  # WordPiece / WordLevel / Unigram map whole runs to their unknown token
        return None
    if model.unk_token and model.fuse_unk and not model.byte_fallback:
        return None  # any run of unknown characters becomes one token
    shrink = _normalizer_shrink(_state(tok.normalizer))
    pre = _state(tok.pre_tokenizer)
    if shrink is None or not _pre_tokenizer_keeps_text(pre):
        return None
    added = tok.get_added_tokens_decoder().values()
    if any(t.lstrip or t.rstrip for t in added):
        return None  # such a token takes in the whitespace beside it, however long
    byte_level = _uses_byte_level(pre)
    longest = max((len(s) if byte_level else len(s.encode()) for s in tok.get_vocab(with_added_tokens=False)),
                  default=1)
    longest = max([longest, *(len(t.content.encode()) for t in added)])
    if model.unk_token and not model.byte_fallback:
        longest = max(longest, _MAX_CHAR_BYTES)
    return longest * shrink


def max_prompt_bytes(tok: HFTokenizer, max_model_len: int) -> int | None:
    """The most UTF-8 bytes a text of at most ``max_model_len`` tokens can have (None: no bound for ``tok``)."""
    per_token = max_token_bytes(tok)
    if per_token is None:
        log.info("this tokenizer gives no bound on bytes per token: every prompt is tokenized before its length "
                 "is checked")
        return None
    return int(per_token * max_model_len)
