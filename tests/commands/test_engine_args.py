"""The engine flags, derived from EngineConfig's fields: every field has one, same defaults, same spellings."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from cinq.commands.engine_args import add_engine_args, engine_config_from_args
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    return p.parse_args(list(argv))


def test_no_flags_give_the_dataclass_defaults(tiny_llama):
    cfg = engine_config_from_args(parse(str(tiny_llama)))
    expected = EngineConfig(model=str(tiny_llama))
    assert cfg == expected
    assert cfg.seed is None and cfg.generation_config == "auto"  # a fresh seed per engine; the model's defaults


def test_an_embedded_model_name_is_its_folder_and_a_bad_one_names_the_argument():
    from cinq.assets import ASSETS_DIR, shipped_model_path
    from cinq.errors import ModelLoadError
    if shipped_model_path("cinq-tiny") is None:
        pytest.skip("cinq-tiny is not shipped in this checkout")
    assert engine_config_from_args(parse("cinq-tiny")).model == str(ASSETS_DIR / "cinq-tiny")
    with pytest.raises(ModelLoadError, match=r"^model: 'no/such/model' is neither a model folder") as e:
        engine_config_from_args(parse("no/such/model"))
    assert e.value.param == "model" and "\n" not in str(e.value)


def test_no_model_means_the_embedded_one():
    from cinq.assets import default_model_path
    assert engine_config_from_args(parse()).model == str(default_model_path())


def test_every_field_but_model_is_a_flag():
    args = vars(parse("m"))
    assert set(args) == {f.name for f in dataclasses.fields(EngineConfig)} | {"engine_config_file"}


def test_existing_spellings_and_types(tiny_llama):
    m = str(tiny_llama)
    cfg = engine_config_from_args(parse(
        m, "--tokenizer", "t", "--dtype", "float32", "--device", "cpu", "--max-model-len", "512",
        "--block-size", "32", "--kv-cache-memory", "0.5", "--kv-cache-memory-fraction", "0.3",
        "--num-kv-blocks", "64", "--max-num-batched-tokens", "256", "--max-num-seqs", "4", "--no-prefix-caching",
        "--attention-backend", "flash-torch", "--seed", "7", "--num-threads", "2", "--tensor-parallel-size", "1",
        "--generation-config", "vllm"))
    assert cfg == EngineConfig(
        model=m, tokenizer="t", dtype="float32", device="cpu", max_model_len=512, block_size=32,
        kv_cache_memory=0.5, kv_cache_memory_fraction=0.3, num_kv_blocks=64, max_num_batched_tokens=256,
        max_num_seqs=4, enable_prefix_caching=False, attention_backend="flash-torch", seed=7, num_threads=2,
        generation_config="vllm")
    assert isinstance(cfg.kv_cache_memory, float) and isinstance(cfg.max_model_len, int)


def test_dtype_choices_come_from_the_config(capsys):
    with pytest.raises(SystemExit):
        parse("m", "--dtype", "int8")
    assert "invalid choice: 'int8'" in capsys.readouterr().err


def test_tensor_parallel_size_flag_reaches_the_config(tiny_llama):
    assert engine_config_from_args(parse(str(tiny_llama), "--tensor-parallel-size", "2")).tensor_parallel_size == 2
    with pytest.raises(InvalidParameterError, match="tensor_parallel_size must be an integer"):
        engine_config_from_args(parse(str(tiny_llama), "--tensor-parallel-size", "0"))


def test_engine_argv_gives_the_config_back(tiny_llama):
    from cinq.config_argv import engine_argv
    cfg = EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=40, kv_cache_memory=0.5,
                       enable_prefix_caching=False, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                                        "prompt_lookup_max": 3})
    argv = engine_argv(cfg)
    assert argv[0] == str(tiny_llama) and "--no-prefix-caching" in argv and "--block-size" not in argv  # defaults
    assert engine_config_from_args(parse(*argv)) == cfg
    assert engine_argv(EngineConfig(model=str(tiny_llama))) == [str(tiny_llama)]


def test_config_file_sets_engine_arguments_and_flags_given_win(tiny_llama, tmp_path):
    import json
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    path = tmp_path / "engine.json"
    path.write_text(json.dumps({"model": str(tiny_llama), "max-num-seqs": 7, "max_num_batched_tokens": 96,
                                "enable_prefix_caching": False, "speculative_config": spec}))
    cfg = engine_config_from_args(parse("--config", str(path), "--max-num-batched-tokens", "64"))
    assert cfg.model == str(tiny_llama) and cfg.max_num_seqs == 7 and not cfg.enable_prefix_caching
    assert cfg.max_num_batched_tokens == 64  # the flag given wins over the file
    assert cfg.speculative_config.num_speculative_tokens == 2
    assert engine_config_from_args(parse(str(tiny_llama), "--config", str(path))).model == str(tiny_llama)


def test_config_file_round_trips_and_a_relative_model_is_read_from_its_folder(tiny_llama, tmp_path):
    import json
    import shutil

    from cinq.config_argv import config_file_dict
    shutil.copytree(tiny_llama, tmp_path / "m")
    cfg = EngineConfig(model=str(tmp_path / "m"), max_num_seqs=3, dtype="float32")
    written = config_file_dict(cfg)
    assert written == {"model": str(tmp_path / "m"), "max_num_seqs": 3, "dtype": "float32"}
    (tmp_path / "c.json").write_text(json.dumps({**written, "model": "m"}))
    back = engine_config_from_args(parse("--config", str(tmp_path / "c.json")))
    assert back == cfg


@pytest.mark.parametrize("content, match", [
    ('{"max_num_seq": 4}', r"unknown engine argument 'max_num_seq'"),
    ('[1, 2]', r"one object of engine arguments, got list"),
    ('{"max_num_seqs": ', r"not valid JSON"),
    ('{"max_num_seqs": "8"}', r"max_num_seqs must be int, got '8'"),
    ('{"enable_prefix_caching": 1}', r"enable_prefix_caching must be bool"),
])
def test_bad_config_files_give_one_line_naming_the_problem(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InvalidParameterError, match=match) as e:
        engine_config_from_args(parse("--config", str(path)))
    assert "\n" not in str(e.value)
    with pytest.raises(InvalidParameterError, match="cannot read"):
        engine_config_from_args(parse("--config", str(tmp_path / "missing.json")))
