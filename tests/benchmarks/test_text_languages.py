"""The held-out text split by language: scripts and common words decide, every record lands somewhere."""

from __future__ import annotations

import pytest

from cinq.assets.text import resolve_text_path
from benchmarks.text_languages import LANGUAGES, language_records, language_token_ids, record_language
from cinq.errors import InvalidParameterError
from cinq.model.tokenizer import Tokenizer


@pytest.mark.parametrize("record, lang", [
    ("The quick brown fox is not the one you want for the job.", "en"),
    ("Wer nicht wagt, der nicht gewinnt. Das ist die Wahrheit über Füße.", "de"),
    ("El que no arriesga no gana, y la vida es así para los que esperan.", "es"),
    ("Non è vero che il tempo sia denaro, ma sono più felice così.", "it"),
    ("Nie ma róży bez kolców, a życie jest jak pudełko czekoladek.", "pl"),
    ("Kdo jinému jámu kopá, sám do ní padá; není to tak, když řeknu.", "cs"),
    ("Без труда не вытащишь и рыбку из пруда.", "ru"),
    ("使用 PPPoE 直接连接到广域网的电脑", "zh"),
    ("def scan(s):\n    return s", "code"),
    ("Question: Ann has 3 apples and buys 4 more. How many?", "arithmetic"),
])
def test_record_language(record, lang):
    assert record_language(record) == lang


def test_every_record_of_the_held_out_text_is_grouped_once():
    groups = language_records("held-out")
    assert list(groups) == [lang for lang in LANGUAGES if lang in groups]
    assert {"en", "de", "ru", "zh", "code", "arithmetic"} <= set(groups)
    records = [r for r in resolve_text_path("held-out").read_text(encoding="utf-8").split("\n\n") if r.strip()]
    assert sum(len(g) for g in groups.values()) == len(records)


def test_token_ids_per_language_are_cut_to_size(tiny_llama):
    tok = Tokenizer.from_pretrained(tiny_llama)
    ids = language_token_ids(tok, 40)
    assert set(ids) == set(language_records()) and all(len(v) == 40 for v in ids.values())
    assert ids["ru"] != ids["en"]
    with pytest.raises(InvalidParameterError, match="max_tokens"):
        language_token_ids(tok, 1)
    with pytest.raises(InvalidParameterError, match="text"):
        language_records("no-such-text")
