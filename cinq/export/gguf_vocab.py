"""A model folder's byte-level BPE tokenizer as GGUF vocabulary metadata (``tokenizer.ggml.*``).

llama.cpp's ``gpt2`` tokenizer model is a byte-level BPE: the token strings and merges of ``tokenizer.json`` go in
as they are (GPT-2's byte-to-character map included), and ``tokenizer.ggml.pre`` names the regex set llama.cpp
splits text with before merging. That name must describe the same splitting as tokenizer.json's
``pre_tokenizer``, or llama.cpp's token ids for a text differ from cinq's; only the layouts whose llama.cpp
counterpart is known are accepted (``PRE_TOKENIZERS``), anything else is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cinq.errors import ModelLoadError
from cinq.model.folder_files import MAX_TOKENIZER_BYTES, exists, read_json
from cinq.model.tokenizer import Tokenizer

# GGUF token types (gguf.TokenType; repeated here so that this module needs no gguf import to be read)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

# A merge of two-character parts (GPT-2's character for byte 0, chr(256), doubled): never fires without other
# merges, since BPE symbols start as single characters and only merges make longer ones
_NEVER_MERGE = f"{chr(256) * 2} {chr(256) * 2}"
# GPT-2's split regex, which tokenizers' ByteLevel(use_regex=true) applies
_GPT2 = ("ByteLevel", True)
# tokenizer.json pre_tokenizer shapes -> llama.cpp's tokenizer.ggml.pre with the same splitting:
# - "gpt-2": the GPT-2 regex alone;
# - "starcoder": every digit split off on its own (\p{N}, which is tokenizers' Digits(individual_digits=true):
#   Unicode numerics, isolated), then the GPT-2 regex (llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_STARCODER).
PRE_TOKENIZERS: dict[tuple[tuple[str, bool], ...], str] = {
    (_GPT2,): "gpt-2",
    (("Digits", True), _GPT2): "starcoder",
}


@dataclass(slots=True)
class GGUFVocab:
    """What ``tokenizer.ggml.*`` holds for one model: one entry per embedding row."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None
    num_padding_tokens: int = 0


def read_gguf_vocab(folder: str | Path, vocab_size: int, eos_token_ids: list[int]) -> GGUFVocab:
    """The GGUF vocabulary of ``folder``'s tokenizer, padded with unused ``[PAD<id>]`` entries up to the model's
    ``vocab_size`` (llama.cpp sizes the embedding by the token list). Refuses (ModelLoadError naming the file and
    the field) a tokenizer that is not byte-level BPE or splits text in a way llama.cpp cannot reproduce."""
    folder = Path(folder)
    tok_file = folder / "tokenizer.json"
    if not exists(tok_file):
        raise ModelLoadError(f"{folder}: no tokenizer.json (a GGUF file needs the tokenizer)")
    raw = read_json(tok_file, MAX_TOKENIZER_BYTES)
    model = raw.get("model") or {}
    if model.get("type") != "BPE" or (raw.get("decoder") or {}).get("type") != "ByteLevel":
        raise ModelLoadError(f"{tok_file}: model.type {model.get('type')!r} with decoder "
                             f"{(raw.get('decoder') or {}).get('type')!r}: only byte-level BPE (model BPE, decoder "
                             f"ByteLevel) is exported to GGUF", "tokenizer")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    pre = _pre_tokenizer_name(raw.get("pre_tokenizer"), bool(merges), tok_file)

    tokenizer = Tokenizer.from_pretrained(folder, eos_token_ids)
    size = tokenizer.vocab_size
    if size > vocab_size:
        raise ModelLoadError(f"{tok_file}: {size} tokens but the model's vocab_size is {vocab_size}", "vocab_size")
    tokens, types = [f"[PAD{i}]" for i in range(vocab_size)], [UNUSED] * vocab_size
    entries = [(text, token_id, NORMAL) for text, token_id in (model.get("vocab") or {}).items()]
    entries += [(a.get("content"), a.get("id"), CONTROL if a.get("special") else USER_DEFINED)
                for a in raw.get("added_tokens") or []]
    for text, token_id, kind in entries:
        if not isinstance(token_id, int) or not 0 <= token_id < vocab_size or not isinstance(text, str):
            raise ModelLoadError(f"{tok_file}: token {text!r} has id {token_id!r}, outside the model's vocabulary "
                                 f"(0..{vocab_size - 1})", "vocab_size")
        tokens[token_id], types[token_id] = text, kind
    if not merges:
        # A merge-free vocabulary (cinq's byte tokenizer): llama.cpp refuses a gpt2 vocabulary without a merge
        # list, and GGUF has no empty arrays: one merge that can never fire changes nothing.
        merges = [_NEVER_MERGE]
    eos = tokenizer.eos_token_ids
    return GGUFVocab(tokens=tokens, token_types=types, merges=merges, pre=pre,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=eos[0] if eos else None,
                     pad_token_id=tokenizer.pad_token_id, add_bos_token=tokenizer.add_bos_token,
                     eos_token_ids=eos, chat_template=tokenizer.chat_template,
                     num_padding_tokens=vocab_size - size)


def _pre_tokenizer_name(pre: Any, has_merges: bool, source: Path) -> str:
    if not has_merges:
        return "gpt-2"  # one token per byte: how text is split before merging cannot change the ids
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    shape: list[tuple[str, bool]] = []
    for step in steps or []:
        if not isinstance(step, dict):
            shape = []
            break
        kind = step.get("type")
        if kind == "ByteLevel":
            if step.get("add_prefix_space"):
                shape = []
                break
            shape.append((kind, bool(step.get("use_regex", True))))
        elif kind == "Digits":
            shape.append((kind, bool(step.get("individual_digits"))))
        else:
            shape = []
            break
    name = PRE_TOKENIZERS.get(tuple(shape))
    if name is None:
        raise ModelLoadError(f"{source}: pre_tokenizer {pre!r} has no llama.cpp counterpart known to cinq "
                             f"(exported: ByteLevel with GPT-2's regex, optionally after Digits(individual_digits))",
                             "pre_tokenizer")
    return name
