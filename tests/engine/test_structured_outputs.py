"""The engine's grammar manager: the tokenizer it hands structured/ stops on the model's eos ids as well as the
tokenizer's own, and a tokenizer-only folder still loads."""

from __future__ import annotations

import shutil
from pathlib import Path

from cinq.assets import resolve_model_path
from cinq.engine.structured_outputs import grammar_tokenizer
from cinq.model.config import ModelConfig
from cinq.model.tokenizer import Tokenizer


def test_the_grammar_tokenizer_stops_on_the_models_eos_too() -> None:
    path = resolve_model_path("cinq-tiny")
    own, model = Tokenizer.from_pretrained(path).eos_token_ids, ModelConfig.from_pretrained(path).eos_token_ids
    assert set(model) - set(own)  # cinq-tiny's generation config adds stops the tokenizer does not name
    assert grammar_tokenizer(path).eos_token_ids == list(dict.fromkeys(own + model))


def test_a_tokenizer_only_folder_stops_on_its_own_eos(tmp_path: Path) -> None:
    path = resolve_model_path("cinq-tiny")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(path) / name, tmp_path / name)
    assert grammar_tokenizer(tmp_path).eos_token_ids == Tokenizer.from_pretrained(path).eos_token_ids
