"""Train cinq's byte-level BPE tokenizer with ``tokenizers`` and save it as a Hugging Face tokenizer folder.

Digits are split one per token before BPE (as Llama and most current tokenizers do): arithmetic then works on
digits the model can compose, instead of on hundreds of arbitrary number tokens. Special tokens and the chat
template are cinq's (``cinq.model.byte_tokenizer``), so every cinq model folder speaks the same chat format.
The BOS that tokenizer_config.json's ``add_bos_token`` promises is added by tokenizer.json's post-processor, the
only place transformers >= 5 looks (``cinq.model.tokenizer``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cinq.errors import InvalidParameterError
from cinq.model.byte_tokenizer import CHAT_TEMPLATE, SPECIALS
from cinq.model.folder_files import MAX_TOKENIZER_CONFIG_BYTES, read_json
from cinq.model.tokenizer import add_bos_post_processor, post_processor_adds

BOS, EOS, PAD = "<|bos|>", "<|end|>", "<|pad|>"


def train_bpe(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (specials first, then the 256 bytes, then merges) whose
    post-processor prepends ``<|bos|>`` when special tokens are asked for."""
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
    return add_bos_post_processor(tok, BOS)


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
    """Write tokenizer.json + tokenizer_config.json + special_tokens_map.json into ``path``. The saved
    tokenizer.json gets the BOS post-processor whatever ``tok`` had (``tok`` itself is left as it is), so that it
    says what the written ``add_bos_token: true`` says."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    add_bos_post_processor(Tokenizer.from_str(tok.to_str()), BOS).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(model_max_length), indent=2) + "\n")
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (path / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    return path


def repair_bos_post_processor(path: str | Path) -> bool:
    """Give the tokenizer.json of folder ``path`` the BOS post-processor when its tokenizer_config.json asks for
    ``add_bos_token`` and the post-processor does not add that BOS (folders written before cinq wrote one).
    Only the post-processor changes: vocabulary, merges and ids stay. Returns whether the file was rewritten."""
    path = Path(path)
    cfg_file = path / "tokenizer_config.json"
    config = read_json(cfg_file, MAX_TOKENIZER_CONFIG_BYTES) if cfg_file.is_file() else {}
    bos = config.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    if not config.get("add_bos_token") or not isinstance(bos, str):
        return False
    tok = load_tokenizer(path)
    if post_processor_adds(tok, tok.token_to_id(bos)):
        return False
    add_bos_post_processor(tok, bos).save(str(path / "tokenizer.json"))
    return True


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The ``tokenizers`` object of a tokenizer folder (or a tokenizer.json path)."""
    path = Path(path)
    return Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """Ids of bos, eos (``<|end|>``) and pad."""
    return {"bos": tok.token_to_id(BOS), "eos": tok.token_to_id(EOS), "pad": tok.token_to_id(PAD)}
