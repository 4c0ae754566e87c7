"""The engine's grammar manager: structured/ knows no model, so the engine hands it the model's tokenizer, its
stop ids the tokenizer's eos and the model's (config.json, generation_config.json)."""

from __future__ import annotations

from pathlib import Path

from cinq.model.config import ModelConfig
from cinq.model.tokenizer import Tokenizer
from cinq.structured.manager import StructuredOutputManager


def grammar_tokenizer(model: str | Path) -> Tokenizer:
    """The tokenizer of a model folder or GGUF file, with the model's eos ids among its own."""
    try:
        model_eos = list(ModelConfig.from_pretrained(model).eos_token_ids)
    except Exception:  # noqa: BLE001 - a tokenizer-only folder: its own eos
        model_eos = []
    return Tokenizer.from_pretrained(model, model_eos)


def structured_output_manager(model: str | Path, vocab_size: int) -> StructuredOutputManager:
    """The process's grammar manager for ``model``'s tokenizer (loaded on the first constrained request)."""
    return StructuredOutputManager.for_model(str(model), vocab_size, lambda: grammar_tokenizer(model))
