"""Incremental detokenization: no broken UTF-8 in any delta, stop strings found across token boundaries."""

from __future__ import annotations

import pytest

from cinq.engine.detokenizer import IncrementalDetokenizer
from cinq.model.byte_tokenizer import build_byte_tokenizer
from cinq.model.tokenizer import Tokenizer
from cinq.sampling_params import SamplingParams

TEXT = "héllo wörld — 中文字符 🙂 done"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(build_byte_tokenizer(), {"eos_token": "<|end|>"})


def test_deltas_are_whole_characters_and_add_up(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) > len(TEXT)  # multi-byte characters really are split across tokens
    d = IncrementalDetokenizer(tok, tok.encode("prompt: "), SamplingParams())
    deltas = []
    for i in ids:
        before = d.output_text
        d.update([i])
        deltas.append(d.output_text[len(before):])
    assert all("\ufffd" not in x for x in deltas)
    assert "".join(deltas) == TEXT


def test_stop_string_across_token_boundaries(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=["never", "lo wö"]))
    hit = None
    fed = 0
    for i in ids:
        fed += 1
        hit = d.update([i])
        if hit:
            break
    assert hit == "lo wö" and d.output_text == "hél"
    assert fed < len(ids)


def test_include_stop_and_hold_back(tok):
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=["wör"], include_stop_str_in_output=True))
    d.update(tok.encode("héllo wörld", add_special_tokens=False))
    assert d.output_text == "héllo wör"
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=["xyz"]))
    d.update(tok.encode("abcx", add_special_tokens=False))
    assert d.visible_text(finished=False) == "ab"  # the last len("xyz") - 1 characters are held back
    assert d.visible_text(finished=True) == "abcx"


def test_several_tokens_in_one_update(tok):
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=["字"]))
    assert d.update(tok.encode(TEXT, add_special_tokens=False)) == "字"
    assert d.output_text == "héllo wörld — 中文"


def test_stop_strings_count_only_past_min_tokens(tok):
    # vLLM's rule: a stop string is looked for in the text of output tokens past the first min_tokens
    ids = tok.encode("a.b.c.", add_special_tokens=False)  # one token a character
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=["."], min_tokens=3, max_tokens=10))
    hits = [d.update([i]) for i in ids[:4]]
    assert hits == [None, None, None, "."] and d.output_text == "a.b"  # the "." of token 2 does not count
    plain = IncrementalDetokenizer(tok, [], SamplingParams(stop=["."]))
    assert [plain.update([i]) for i in ids[:2]] == [None, "."] and plain.output_text == "a"
