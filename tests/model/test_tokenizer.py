"""Tokenizer wrapper: encode/decode, BOS handling, chat templates (against transformers' rendering)."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.model.tokenizer import Tokenizer


def test_round_trip_and_bos(tiny_llama):
    tok = Tokenizer.from_pretrained(tiny_llama)
    ids = tok.encode("héllo")
    assert ids[0] == tok.bos_token_id and tok.decode(ids) == "héllo"
    assert tok.encode("héllo", add_special_tokens=False) == ids[1:]
    assert tok.eos_token_ids == [tok._tok.token_to_id("<|end|>")]


def test_chat_template_matches_transformers(tiny_llama):
    from transformers import AutoTokenizer
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    ours = Tokenizer.from_pretrained(tiny_llama).apply_chat_template(msgs)
    theirs = AutoTokenizer.from_pretrained(tiny_llama).apply_chat_template(msgs, tokenize=False,
                                                                             add_generation_prompt=True)
    assert ours == theirs


def test_text_holding_the_bos_token_is_encoded_as_transformers_does(tiny_llama):
    """No BOS de-duplication: a prompt that starts with "<|bos|>" gets the post-processor's BOS too, as under
    transformers (rendered chat templates, which hold their BOS, are encoded without special tokens)."""
    from transformers import AutoTokenizer
    tok, hf = Tokenizer.from_pretrained(tiny_llama), AutoTokenizer.from_pretrained(tiny_llama)
    for text in ("<|bos|>hi", "hi", ""):
        assert tok.encode(text) == hf.encode(text)
        assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    assert tok.encode("<|bos|>hi")[:2] == [tok.bos_token_id] * 2


def test_empty_messages_is_an_error(tiny_llama):
    with pytest.raises(InvalidParameterError, match="messages"):
        Tokenizer.from_pretrained(tiny_llama).apply_chat_template([])
