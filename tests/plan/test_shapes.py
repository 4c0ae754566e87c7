"""Model shapes by name, config.json file, folder and embedded name."""

from __future__ import annotations

import json

import pytest

from cinq.errors import InvalidParameterError
from cinq.plan.shapes import KNOWN_SHAPES, known_shape, resolve_shape


def test_known_names_carry_the_released_numbers():
    cfg = resolve_shape("Llama-3-70B").config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings) == \
        (80, 8192, 64, 8, 128, 28672, 128256, False)
    qwen = resolve_shape("Qwen2.5-7B").config
    assert qwen.attention_bias and qwen.head_dim == 3584 // 28 and qwen.num_key_value_heads == 4
    assert resolve_shape("Qwen3-8B").config.qk_norm


def test_names_are_case_insensitive_with_org_prefix_and_aliases():
    assert resolve_shape("meta-llama/llama-3-8b").name == "Llama-3-8B"
    assert resolve_shape("mistral-7b").name == "Mistral-7B-v0.3"
    assert known_shape("no-such-model") is None


def test_every_known_shape_parses():
    for name in KNOWN_SHAPES:
        assert resolve_shape(name).config.num_hidden_layers > 0


def test_config_json_file_and_folder_and_embedded_name(tmp_path):
    cfg = dict(KNOWN_SHAPES["Llama-3-8B"], num_hidden_layers=3)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    by_file = resolve_shape(str(tmp_path / "m" / "config.json"))
    by_folder = resolve_shape(str(tmp_path / "m"))
    assert by_file.config.num_hidden_layers == by_folder.config.num_hidden_layers == 3
    assert by_folder.name == "m"
    tiny = resolve_shape("cinq-tiny")
    assert tiny.name == "cinq-tiny" and tiny.config.hidden_size == 384


def test_unknown_model_names_the_field_and_the_known_shapes():
    with pytest.raises(InvalidParameterError) as e:
        resolve_shape("Llama-9-1T")
    assert e.value.param == "model" and "Llama-3-70B" in str(e.value) and "cinq-tiny" in str(e.value)
