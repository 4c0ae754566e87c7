"""A byte-level tokenizer with no merges (256 byte tokens + specials): lets cinq build a runnable model folder
with no training and no download (tests, benchmarks, the random fallback model)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from cinq.model.tokenizer import add_bos_post_processor

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]

# A small chat template in the HF/jinja2 dialect: role markers as special tokens, <|end|> closes a turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_byte_tokenizer() -> Tokenizer:
    """Byte-level BPE with an empty merge list: every UTF-8 byte is one token; ids 0..255 are the bytes. Encoding
    with special tokens prepends ``<|bos|>`` (the post-processor), so transformers agrees with the config's
    ``add_bos_token``."""
    byte_to_char = _gpt2_byte_chars()
    vocab = {byte_to_char[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return add_bos_post_processor(tok, "<|bos|>")


def _gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE: printable latin-1 bytes stand for
    themselves, the others take the characters 256, 257, ... in byte order."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def save_byte_tokenizer(path: str | Path) -> Path:
    """Write tokenizer.json + tokenizer_config.json (special tokens, chat template) into ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_byte_tokenizer()
    tok.save(str(path / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>", "eos_token": "<|end|>", "pad_token": "<|pad|>",
        "add_bos_token": True, "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path
