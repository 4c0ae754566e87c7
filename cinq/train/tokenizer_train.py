"""Train cinq's byte-level BPE tokenizer with ``tokenizers`` and save it as a Hugging Face tokenizer folder.

Digits are split one per token before BPE (as Llama and most current tokenizers do): arithmetic then works on
digits the model can compose, instead of on hundreds of arbitrary number tokens. Special tokens and the chat
template are cinq's (``cinq.model.byte_tokenizer``), so every cinq model folder speaks the same chat format.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cinq.errors import InvalidParameterError
from cinq.model.byte_tokenizer import CHAT_TEMPLATE, SPECIALS

BOS, EOS, PAD = "<|bos|>", "<|end|>", "<|pad|>"


def train_bpe(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (specials first, then the 256 bytes, then merges)."""
    if not isinstance(vocab_size, int) or not (len(SPECIALS) + 256 < vocab_size <= 65535):
        raise InvalidParameterError(
            f"vocab_size must be an integer in ({len(SPECIALS) + 256}, 65535] (token ids are stored as uint16), "
            f"got {vocab_size!r}", "vocab_size")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_config(model_max_length: int = 2048) -> dict[str, object]:
    """tokenizer_config.json: special tokens and the chat template (the fields cinq and transformers read)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "add_bos_token": True, "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }


def save_tokenizer(tok: Tokenizer, path: str | Path, model_max_length: int = 2048) -> Path:
    """Write tokenizer.json + tokenizer_config.json + special_tokens_map.json into ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(model_max_length), indent=2) + "\n")
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (path / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    return path


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The ``tokenizers`` object of a tokenizer folder (or a tokenizer.json path)."""
    path = Path(path)
    return Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """Ids of bos, eos (``<|end|>``) and pad."""
    return {"bos": tok.token_to_id(BOS), "eos": tok.token_to_id(EOS), "pad": tok.token_to_id(PAD)}
