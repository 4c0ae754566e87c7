"""Chat prompts for a chat target's heads: the same number per language (or as many, all English), train and
held-out topics disjoint, rendered through the target's template, and a prompt longer than max_prompt refused by
name."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.train.spec_head_prompts import CHAT_LANGUAGES, chat_identity, chat_messages, chat_prompts, is_chat_source


class CharTokenizer:
    """One token per character of the rendered turn (enough to count and compare)."""

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def test_every_language_has_the_same_messages_and_the_splits_share_no_topic() -> None:
    assert {"en", "fr", "de", "es", "it", "ru", "zh", "pl", "cs"} == set(CHAT_LANGUAGES)
    sizes = {lang: (len(chat_messages(lang, "train")), len(chat_messages(lang, "test"))) for lang in CHAT_LANGUAGES}
    assert len(set(sizes.values())) == 1
    for lang in CHAT_LANGUAGES:
        assert not set(chat_messages(lang, "train")) & set(chat_messages(lang, "test"))


def test_prompts_are_balanced_rendered_and_cycle_when_more_are_asked() -> None:
    tok = CharTokenizer()
    per_lang = len(chat_messages("en", "train")) + 3  # more than exist: the list cycles
    pairs = chat_prompts(tok, per_lang * len(CHAT_LANGUAGES), seed=0, max_prompt=400)
    langs = [lang for lang, _ in pairs]
    assert all(langs.count(lang) == per_lang for lang in CHAT_LANGUAGES)
    text = "".join(map(chr, pairs[0][1]))
    assert text.startswith("<user>") and text.endswith("<assistant>")
    assert pairs == chat_prompts(tok, per_lang * len(CHAT_LANGUAGES), seed=0, max_prompt=400)


def test_the_english_mix_holds_as_many_prompts_all_english_in_the_balanced_order() -> None:
    tok = CharTokenizer()
    n = 5 * len(CHAT_LANGUAGES)
    english = chat_prompts(tok, n, seed=0, max_prompt=400, mix="english")
    balanced = chat_prompts(tok, n, seed=0, max_prompt=400)
    assert len(english) == len(balanced) and {lang for lang, _ in english} == {"en"}
    assert english[:5] == [pair for pair in balanced if pair[0] == "en"]  # the same English draw, continued
    with pytest.raises(InvalidParameterError) as e:
        chat_prompts(tok, n, seed=0, max_prompt=400, mix="natural")
    assert e.value.param == "prompt_mix"


def test_a_prompt_longer_than_max_prompt_is_refused_by_name() -> None:
    with pytest.raises(InvalidParameterError) as e:
        chat_prompts(CharTokenizer(), 9, seed=0, max_prompt=10)
    assert e.value.param == "max_prompt"


def test_source_name_and_identity() -> None:
    assert is_chat_source("chat") and not is_chat_source("data/corpus")
    assert chat_identity() == chat_identity() and len(chat_identity()["chat_prompts"]) == 16
    with pytest.raises(InvalidParameterError):
        chat_messages("xx", "train")
