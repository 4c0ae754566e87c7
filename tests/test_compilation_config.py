"""CompilationConfig (vLLM's compilation_config names) and the engine flags that carry it."""

from __future__ import annotations

import argparse

import pytest

from cinq.commands.engine_args import add_engine_args, engine_config_from_args
from cinq.config_argv import engine_argv
from cinq.compilation_config import CompilationConfig
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError


def test_default_is_eager_and_sizes_are_sorted_unique():
    assert not CompilationConfig().enabled
    assert not EngineConfig().compiles_decode
    cc = CompilationConfig(mode=3, compile_sizes=[8, 1, 4, 4])
    assert cc.enabled and cc.compile_sizes == [1, 4, 8]


def test_padded_size_is_the_next_compile_size():
    cc = CompilationConfig(mode=3, compile_sizes=[1, 2, 4, 8])
    assert [cc.padded_size(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]


@pytest.mark.parametrize("kwargs,param", [
    ({"mode": 4}, "mode"), ({"mode": True}, "mode"), ({"backend": "tvm"}, "backend"),
    ({"compile_sizes": []}, "compile_sizes"), ({"compile_sizes": [0]}, "compile_sizes"),
    ({"compile_sizes": [1, 2.5]}, "compile_sizes"), ({"compile_sizes": list(range(1, 10))}, "compile_sizes"),
])
def test_bad_fields_name_themselves(kwargs, param):
    with pytest.raises(InvalidParameterError) as e:
        CompilationConfig(**kwargs)
    assert e.value.param == param


def test_from_dict_takes_vllm_level_and_refuses_unknown_keys():
    assert CompilationConfig.from_dict({"level": 3}).mode == 3
    with pytest.raises(InvalidParameterError) as e:
        CompilationConfig.from_dict({"level": 3, "mode": 0})
    assert e.value.param == "mode"
    with pytest.raises(InvalidParameterError) as e:
        CompilationConfig.from_dict({"mode": 3, "cudagraph_mode": 1})
    assert e.value.param == "cudagraph_mode"


def test_capture_sizes_default_to_compile_sizes_and_are_checked():
    assert CompilationConfig(compile_sizes=[4, 1]).capture_sizes == [1, 4]
    assert CompilationConfig(compile_sizes=[1], cudagraph_capture_sizes=[8, 2, 2]).capture_sizes == [2, 8]
    with pytest.raises(InvalidParameterError) as e:
        CompilationConfig(cudagraph_capture_sizes=[0])
    assert e.value.param == "cudagraph_capture_sizes"
    with pytest.raises(InvalidParameterError) as e:
        CompilationConfig(inductor_compile_config=["cpp_wrapper"])
    assert e.value.param == "inductor_compile_config"


def test_engine_config_parses_the_dict_and_enforce_eager_wins():
    cfg = EngineConfig(compilation_config={"mode": 3, "compile_sizes": [2]})
    assert isinstance(cfg.compilation_config, CompilationConfig) and cfg.compiles_decode
    assert not EngineConfig(compilation_config={"mode": 3}, enforce_eager=True).compiles_decode
    with pytest.raises(InvalidParameterError) as e:
        EngineConfig(compilation_config=[1, 2])
    assert e.value.param == "compilation_config"


def test_cli_flags_round_trip():
    p = argparse.ArgumentParser()
    add_engine_args(p)
    args = p.parse_args(["--enforce-eager", "--compilation-config", '{"mode": 3, "compile_sizes": [1, 4]}'])
    cfg = engine_config_from_args(args)
    assert cfg.enforce_eager and cfg.compilation_config == CompilationConfig(mode=3, compile_sizes=[1, 4])
    again = engine_config_from_args(p.parse_args(engine_argv(cfg)))
    assert again.compilation_config == cfg.compilation_config and again.enforce_eager
