"""Default sampling from generation_config.json (vLLM's generation_config="auto") and the config cinq writes."""

from __future__ import annotations

import json

import pytest

from cinq.assets import ASSETS_DIR
from cinq.errors import ModelLoadError
from cinq.model.config import ModelConfig
from cinq.model.generation_defaults import (CINQ_SAMPLING_DEFAULTS, cinq_generation_config, fill_defaults,
                                            read_sampling_defaults, sampling_defaults_from_dict)
from cinq.model.saver import chat_turn_markers


def write_gen(folder, **gen):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps(gen))
    return folder


def test_sampling_keys_map_to_vllm_names_and_the_rest_is_ignored(tmp_path):
    folder = write_gen(tmp_path / "m", temperature=0.6, top_p=0.9, top_k=20, min_p=0.05, repetition_penalty=1.05,
                       max_new_tokens=64, min_new_tokens=4, do_sample=True, eos_token_id=[1, 2], max_length=20,
                       presence_penalty=None)
    assert read_sampling_defaults("auto", folder) == {
        "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.05,
        "max_tokens": 64, "min_tokens": 4}


def test_vllm_and_cinq_ignore_the_file_and_auto_without_one_is_empty(tmp_path):
    folder = write_gen(tmp_path / "m", temperature=0.6)
    assert read_sampling_defaults("vllm", folder) == read_sampling_defaults("cinq", folder) == {}
    assert read_sampling_defaults("auto", tmp_path) == {}  # no generation_config.json: no defaults


def test_a_folder_path_reads_that_folders_file_and_a_bad_value_names_the_field(tmp_path):
    other = write_gen(tmp_path / "other", temperature=0.3)
    assert read_sampling_defaults(str(other), tmp_path / "model") == {"temperature": 0.3}
    with pytest.raises(ModelLoadError, match="^generation_config: 'none' is none of 'auto', 'vllm'") as e:
        read_sampling_defaults("none", tmp_path)
    assert e.value.param == "generation_config"


@pytest.mark.parametrize("key,value,match", [
    ("temperature", -1, r"'temperature': temperature must be in \[0.0, 100.0\], got -1"),
    ("temperature", "hot", "'temperature': temperature must be a number"),
    ("max_new_tokens", 1.5, "'max_new_tokens': max_tokens must be an integer"),
    ("top_p", 0, r"'top_p': top_p must be in \(0.0, 1.0\]"),
])
def test_bad_values_name_the_file_and_the_key(tmp_path, key, value, match):
    folder = write_gen(tmp_path / "m", **{key: value})
    with pytest.raises(ModelLoadError, match=match) as e:
        read_sampling_defaults("auto", folder)
    assert str(folder / "generation_config.json") in str(e.value) and e.value.param == "generation_config"


def test_min_above_max_in_the_file_is_refused():
    with pytest.raises(ModelLoadError, match="'min_new_tokens': min_tokens"):
        sampling_defaults_from_dict({"min_new_tokens": 9, "max_new_tokens": 4})


def test_given_values_win_and_a_default_minimum_follows_a_given_maximum():
    defaults = {"temperature": 0.7, "max_tokens": 96, "min_tokens": 24}
    assert fill_defaults({"temperature": None, "top_p": 0.5}, defaults) == {**defaults, "top_p": 0.5}
    assert fill_defaults({"max_tokens": 5}, defaults) == {"temperature": 0.7, "max_tokens": 5, "min_tokens": 5}
    assert fill_defaults({"max_tokens": 5, "min_tokens": 2}, defaults)["min_tokens"] == 2
    assert fill_defaults({}, {"min_tokens": 24}) == {"min_tokens": 24, "max_tokens": 24}  # over SamplingParams' 16


def test_cinq_generation_config_adds_turn_markers_and_defaults_only_with_markers():
    assert cinq_generation_config(0, [6], []) == {"bos_token_id": 0, "eos_token_id": [6]}
    gen = cinq_generation_config(0, [6], [3, 4, 5, 6])
    assert gen["eos_token_id"] == [6, 3, 4, 5] and gen["do_sample"] is True
    assert {k: gen[k] for k in CINQ_SAMPLING_DEFAULTS} == CINQ_SAMPLING_DEFAULTS
    assert sampling_defaults_from_dict(gen)["max_tokens"] == CINQ_SAMPLING_DEFAULTS["max_new_tokens"]


@pytest.mark.parametrize("name", ["cinq-tiny", "cinq-tiny-student"])
def test_shipped_generation_configs_are_what_the_saver_writes(name):
    """So a re-export of the shipped models (cinq/train/export.py -> save_model) keeps them as they are."""
    folder = ASSETS_DIR / name
    if not (folder / "config.json").is_file():
        pytest.skip(f"{name} is not shipped in this checkout")
    cfg = ModelConfig.from_dict(json.loads((folder / "config.json").read_text()))
    shipped = json.loads((folder / "generation_config.json").read_text())
    assert chat_turn_markers(cfg) == chat_turn_markers(cfg, folder) == [3, 4, 5, 6]
    assert shipped == cinq_generation_config(cfg.bos_token_id, cfg.eos_token_ids, chat_turn_markers(cfg))
