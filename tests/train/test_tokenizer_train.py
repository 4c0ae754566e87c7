import pytest

from cinq.errors import InvalidParameterError
from cinq.model.byte_tokenizer import SPECIALS
from cinq.model.tokenizer import Tokenizer
from cinq.train.tokenizer_train import load_tokenizer, special_ids, train_bpe

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "Der schnelle braune Fuchs springt. " * 3,
         "Быстрая коричневая лиса. " * 3, "12 + 345 = 357\nAnswer: 357"] * 20


def test_vocab_size_specials_and_digits():
    tok = train_bpe(TEXTS, vocab_size=320)
    assert tok.get_vocab_size() == 320
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(len(SPECIALS)))
    assert tok.encode("345", add_special_tokens=False).tokens == ["3", "4", "5"]
    text = "Быстрая лиса 12 <|user|>"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text
    assert train_bpe(TEXTS, vocab_size=320).to_str() == tok.to_str()  # deterministic


def test_bad_vocab_size_raises():
    with pytest.raises(InvalidParameterError, match="vocab_size"):
        train_bpe(TEXTS, vocab_size=100)


def test_saved_tokenizer_loads_in_cinq_and_transformers(tiny_corpus):
    folder = tiny_corpus / "tokenizer"
    ids = special_ids(load_tokenizer(folder))
    cinq_tok = Tokenizer.from_pretrained(folder)
    text = "Der Hund lief 42 mal."
    enc = cinq_tok.encode(text)
    assert enc[0] == ids["bos"] and cinq_tok.decode(enc) == text
    assert cinq_tok.eos_token_ids == [ids["eos"]]
    chat = cinq_tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|bos|><|user|>hi<|end|><|assistant|>"
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert hf.encode(text, add_special_tokens=False) == enc[1:]
    assert hf.eos_token == "<|end|>" and hf.bos_token == "<|bos|>"
    assert hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                  add_generation_prompt=True) == chat
