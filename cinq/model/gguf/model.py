"""A GGUF file's ``ModelConfig``, linear factory and tokenizer, for the callers that start from a file path
(``Tokenizer.from_pretrained`` comes here for a .gguf path; ``ModelConfig.from_pretrained`` and
cinq/model/loader.py's ``load_gguf_model`` use plan.py and weights.py directly).

End-of-generation tokens: the file's ``eos_token_id`` plus, as llama.cpp does, the control tokens that end a turn
in the chat formats it knows (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>`` ...; gguf/tokenizer.py), so a chat
reply stops at its template's end marker whichever id the file calls eos.
"""

from __future__ import annotations

from pathlib import Path

from cinq.model.config import ModelConfig
from cinq.model.gguf.file import read_gguf
from cinq.model.gguf.plan import gguf_model_dict
from cinq.model.gguf.tokenizer import gguf_tokenizer


def gguf_model_config(path: str | Path) -> ModelConfig:
    """The ``ModelConfig`` of a GGUF file (plan.py's ``gguf_model_dict``, validated)."""
    return ModelConfig.from_dict(gguf_model_dict(read_gguf(path)), source=str(path))


def gguf_hf_tokenizer(path: str | Path, vocab_size: int):
    """(`tokenizers` Tokenizer, tokenizer_config fields) of a GGUF file."""
    return gguf_tokenizer(read_gguf(path), vocab_size)
