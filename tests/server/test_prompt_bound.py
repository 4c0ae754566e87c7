"""The byte bound on a prompt that fits the context: a true upper bound for the tokenizers that have one (no text
of more bytes tokenizes into max_model_len tokens or fewer), and no bound where the tokenizer can drop text."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from cinq.model.byte_tokenizer import SPECIALS, build_byte_tokenizer
from cinq.server.prompt_bound import max_prompt_bytes, max_token_bytes


def _bpe(vocab: list[str], unk: str | None = None, fuse_unk: bool = False, byte_fallback: bool = False) -> Tokenizer:
    return Tokenizer(models.BPE({s: i for i, s in enumerate(vocab)}, [], unk_token=unk, fuse_unk=fuse_unk,
                                byte_fallback=byte_fallback))


def test_byte_level_counts_one_byte_per_character():
    # 256 one-byte tokens; the longest string is a special token ("<|assistant|>", 13 bytes)
    tok = build_byte_tokenizer()
    longest = max(len(s.encode()) for s in SPECIALS)
    assert max_token_bytes(tok) == longest
    assert max_prompt_bytes(tok, 512) == longest * 512


def test_byte_level_characters_of_two_utf8_bytes_count_once():
    # "Ġ" is 2 bytes of UTF-8 but stands for one space: byte-level strings are counted in characters
    tok = _bpe(["Ġ", "a", "ĠĠĠĠĠĠĠĠĠĠ"])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    assert max_token_bytes(tok) == 10


def test_sentencepiece_strings_count_their_utf8_bytes():
    tok = _bpe(["▁", "a", "▁hello", "<0x41>"], unk="<unk>", fuse_unk=True, byte_fallback=True)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    assert max_token_bytes(tok) == len("▁hello".encode())  # 8: the space is 1 byte of input, 3 here


def test_shrinking_normalizers_multiply_the_bound():
    tok = _bpe(["a", "bb"])
    tok.normalizer = normalizers.NFKC()  # "𝐀" (4 bytes) becomes "A"
    assert max_token_bytes(tok) == 2 * 4
    tok.normalizer = normalizers.Replace("abcd", "x")
    assert max_token_bytes(tok) == 2 * 4


@pytest.mark.parametrize("setup", [
    lambda t: setattr(t, "normalizer", normalizers.Strip()),
    lambda t: setattr(t, "normalizer", normalizers.BertNormalizer()),
    lambda t: setattr(t, "normalizer", normalizers.Replace(" ", "")),
    lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()),
    lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Split(" ", "removed")),
    lambda t: t.add_special_tokens([AddedToken("<mask>", lstrip=True)]),
], ids=["strip", "bert", "replace-with-nothing", "whitespace", "split-removed", "lstrip-token"])
def test_tokenizers_that_drop_text_have_no_bound(setup):
    tok = _bpe(["a", "b"])
    setup(tok)
    assert max_token_bytes(tok) is None
    assert max_prompt_bytes(tok, 512) is None


def test_unknown_tokens():
    assert max_token_bytes(_bpe(["a"], unk="<unk>", fuse_unk=True)) is None  # any unknown run: one token
    assert max_token_bytes(_bpe(["a"], unk="<unk>")) == 4  # one unknown character (at most 4 bytes) per token
    assert max_token_bytes(Tokenizer(models.WordPiece({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))) is None


def test_the_bound_holds_for_the_densest_text():
    # The longest token repeated: the most bytes max_model_len tokens can spell is exactly the bound
    tok = build_byte_tokenizer()
    densest = "<|assistant|>" * 512
    assert len(tok.encode(densest, add_special_tokens=False).ids) == 512
    assert len(densest.encode()) == max_prompt_bytes(tok, 512)
