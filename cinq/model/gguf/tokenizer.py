"""The tokenizer a GGUF file describes (``tokenizer.ggml.*``), built as a `tokenizers` Tokenizer, plus the
``tokenizer_config.json`` fields cinq's ``Tokenizer`` reads (special tokens, chat template).

Two vocabulary kinds, as llama.cpp names them in ``tokenizer.ggml.model``:
- ``gpt2``: byte-level BPE. Tokens are stored in GPT-2's byte-to-character spelling with their merges; how text
  is split before merging is named by ``tokenizer.ggml.pre`` (``PRE_SPLITS``: the regexes llama.cpp and
  transformers use for each name; an unknown name splits with GPT-2's regex, as both do). Matches transformers'
  GGUF tokenizer, which adds no BOS for this kind whatever ``add_bos_token`` says.
- ``llama``: SentencePiece BPE (``\u2581`` for spaces, ``<0xNN>`` byte fallback), merges from the file or, when it
  has none, recovered from the vocabulary and its scores (best-scored merged token first); BOS added unless
  ``tokenizer.ggml.add_bos_token`` is false.
Tokens typed CONTROL (3) become special added tokens, USER_DEFINED (4) plain added tokens: both are matched whole.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from cinq.errors import ModelLoadError
from cinq.model.gguf.file import GGUFFile

CONTROL, USER_DEFINED = 3, 4

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DIGITS_FIRST = "digits"  # every digit split off on its own, then GPT-2's regex (llama.cpp's STARCODER kind)
# tokenizer.ggml.pre -> the split before merging (a regex, or _DIGITS_FIRST); anything else: GPT-2's regex
PRE_SPLITS: dict[str, str] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx", "pixtral"), _LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2),
    **dict.fromkeys(("starcoder", "smollm", "refact"), _DIGITS_FIRST),
}


def _strings(gguf: GGUFFile, key: str) -> list[str]:
    value = gguf.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelLoadError(f"{gguf.path}: metadata '{key}' is missing or not an array of strings")
    return value


def _token_id(gguf: GGUFFile, key: str, n: int) -> int | None:
    value = gguf.get(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise ModelLoadError(f"{gguf.path}: metadata 'tokenizer.ggml.{key}': {value!r} is not a token id in "
                             f"[0, {n})")
    return value


def gguf_tokenizer(gguf: GGUFFile, vocab_size: int) -> tuple[HFTokenizer, dict[str, Any]]:
    """(the `tokenizers` Tokenizer, tokenizer_config fields) of the file's vocabulary; ``vocab_size`` is the
    embedding's row count, which the vocabulary must equal (a shorter one leaves rows no text reaches, a longer
    one has ids the model cannot embed)."""
    kind = gguf.get("tokenizer.ggml.model")
    tokens = _strings(gguf, "tokenizer.ggml.tokens")
    if len(tokens) != vocab_size:
        raise ModelLoadError(f"{gguf.path}: metadata 'tokenizer.ggml.tokens' holds {len(tokens)} tokens but "
                             f"token_embd.weight has {vocab_size} rows: the vocabulary must match the embedding")
    types = gguf.get("tokenizer.ggml.token_type")
    types = [int(t) for t in types] if types is not None and len(types) == len(tokens) else [1] * len(tokens)
    if kind == "gpt2":
        tok = _byte_level(gguf, tokens)
        add_bos = False
    elif kind == "llama":
        tok = _sentencepiece(gguf, tokens)
        add_bos = gguf.get("tokenizer.ggml.add_bos_token", True) is not False
    else:
        raise ModelLoadError(f"{gguf.path}: metadata 'tokenizer.ggml.model': {kind!r} is not a tokenizer cinq "
                             f"builds ('gpt2' byte-level BPE, 'llama' SentencePiece)")
    special = [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types) if k == CONTROL]
    user = [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == USER_DEFINED]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    config: dict[str, Any] = {}
    for name in ("bos", "eos", "pad", "unk"):
        token_id = _token_id(gguf, f"{'unknown' if name == 'unk' else 'padding' if name == 'pad' else name}"
                                   f"_token_id", len(tokens))
        if token_id is not None:
            config[f"{name}_token"] = tokens[token_id]
    if add_bos and "bos_token" in config:
        bos = config["bos_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, tokens.index(bos))])
    template = gguf.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        config["chat_template"] = template
    return tok, config


def _byte_level(gguf: GGUFFile, tokens: list[str]) -> HFTokenizer:
    merges = [tuple(m.split(" ", 1)) for m in _strings(gguf, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    bad = next((m for m in merges if len(m) != 2), None)
    if bad is not None:
        raise ModelLoadError(f"{gguf.path}: metadata 'tokenizer.ggml.merges': {' '.join(bad)!r} is not two "
                             f"tokens separated by a space")
    # A merge of parts outside the vocabulary can never fire (llama.cpp keeps it, tokenizers refuses it): cinq's
    # own exporter writes one such merge for a merge-free byte vocabulary, since GGUF has no empty arrays.
    merges = [m for m in merges if m[0] in vocab and m[1] in vocab]
    try:
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a merge of unknown tokens
        raise ModelLoadError(f"{gguf.path}: metadata 'tokenizer.ggml.merges': {e}") from None
    pre = gguf.get("tokenizer.ggml.pre")
    split = PRE_SPLITS.get(pre) if isinstance(pre, str) else None
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif split == _DIGITS_FIRST:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                              use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(gguf: GGUFFile, tokens: list[str]) -> HFTokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    if gguf.get("tokenizer.ggml.merges") is not None:
        merges = [tuple(m.split(" ", 1)) for m in _strings(gguf, "tokenizer.ggml.merges")]
    else:
        scores = gguf.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise ModelLoadError(f"{gguf.path}: metadata 'tokenizer.ggml.scores' is missing or not one per token "
                                 f"(needed to recover the merges of a SentencePiece vocabulary)")
        merges = _merges_from_scores(tokens, [float(s) for s in scores])
    unk = _token_id(gguf, "unknown_token_id", len(tokens))
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=tokens[unk] if unk is not None else None,
                                 fuse_unk=True, byte_fallback=True))
    # Metaspace (as transformers' LlamaTokenizer): spaces become \u2581 and one is prepended to the first piece
    # unless it already starts with one (a text starting with spaces gets no extra)
    prepend = "first" if gguf.get("tokenizer.ggml.add_space_prefix", True) is not False else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=False)
    # the decoder strips the one space the pre-tokenizer prepends; with no prefix (Gemma) there is none to strip
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + [decoders.Strip(" ", 1, 0)] if prepend != "never" else steps)
    return tok


def _merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE keeps no merge list: a token is a merge of two shorter tokens, ranked by its score."""
    vocab = set(tokens)
    ranked: list[tuple[float, int, int, tuple[str, str]]] = []
    for i, (token, score) in enumerate(zip(tokens, scores)):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, i, cut, (left, right)))
    ranked.sort()
    return [pair for *_, pair in ranked]


# Control tokens that end a turn in the chat formats llama.cpp knows: each joins the eos ids
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|end_of_text|>", "</s>")


def end_of_turn_ids(gguf: GGUFFile) -> list[int]:
    """Control tokens of the vocabulary whose text ends a turn in a known chat format."""
    tokens = gguf.get("tokenizer.ggml.tokens") or []
    types = gguf.get("tokenizer.ggml.token_type")
    if types is None or len(types) != len(tokens):
        return []
    return [i for i, (t, k) in enumerate(zip(tokens, types)) if int(k) == CONTROL and t in END_OF_TURN]
