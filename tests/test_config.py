"""EngineConfig and ParallelConfig: validation, the parallel seam, the per-field help the CLI flags come from."""

from __future__ import annotations

import dataclasses

import pytest

from cinq.config import EngineConfig, ParallelConfig
from cinq.errors import InvalidParameterError


def test_defaults_are_one_device():
    cfg = EngineConfig()
    assert cfg.tensor_parallel_size == 1
    assert cfg.parallel_config == ParallelConfig(tensor_parallel_size=1)
    assert cfg.parallel_config.world_size == 1


@pytest.mark.parametrize("value", [0, -1, 1.0, "1", True, None])
def test_tensor_parallel_size_must_be_a_positive_integer(value):
    with pytest.raises(InvalidParameterError, match="tensor_parallel_size must be an integer") as e:
        EngineConfig(tensor_parallel_size=value)
    assert e.value.param == "tensor_parallel_size"


@pytest.mark.parametrize("value", [2, 4])
def test_tensor_parallel_size_above_one_is_accepted(value):
    cfg = EngineConfig(tensor_parallel_size=value)
    assert cfg.parallel_config.world_size == value


@pytest.mark.parametrize("method", ["draft_model", "eagle", "medusa"])
def test_runner_side_speculation_is_refused_with_tensor_parallelism(method):
    spec = {"method": method, "model": "m", "num_speculative_tokens": 2}
    with pytest.raises(InvalidParameterError, match=f"{method}.*not supported with tensor_parallel_size 2") as e:
        EngineConfig(tensor_parallel_size=2, speculative_config=spec)
    assert e.value.param == "speculative_config"
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    assert EngineConfig(tensor_parallel_size=2, speculative_config=ngram).speculative_config.method == "ngram"


def test_parallel_config_world_size_and_validation():
    assert ParallelConfig(tensor_parallel_size=4).world_size == 4
    with pytest.raises(InvalidParameterError) as e:
        ParallelConfig(tensor_parallel_size=0)
    assert e.value.param == "tensor_parallel_size"
    assert not hasattr(ParallelConfig(), "__dict__")  # slots


def test_from_kwargs_rejects_unknown_names_including_the_removed_extra():
    assert EngineConfig.from_kwargs("m", tensor_parallel_size=1, max_num_seqs=3).max_num_seqs == 3
    with pytest.raises(InvalidParameterError, match=r"unknown engine argument\(s\) \['extra'\]") as e:
        EngineConfig.from_kwargs("m", extra={})
    assert e.value.param == "extra"
    assert "tensor_parallel_size" in str(e.value)


def test_every_field_carries_its_help_text():
    for f in dataclasses.fields(EngineConfig):
        assert isinstance(f.metadata.get("help"), str) and f.metadata["help"], f.name
        assert f.default is not dataclasses.MISSING, f.name  # every field has a plain default (no factories)


def test_dtype_aliases_are_accepted_and_others_refused():
    assert EngineConfig(dtype="bf16").dtype == "bf16"
    with pytest.raises(InvalidParameterError, match="dtype must be one of"):
        EngineConfig(dtype="int8")


def test_seed_defaults_to_none_and_a_given_one_is_checked():
    assert EngineConfig().seed is None  # the engine draws a fresh one (vLLM's semantics for an unset seed)
    assert EngineConfig(seed=0).seed == 0
    for bad in (-1, 1 << 63, 1.5, True, "3"):
        with pytest.raises(InvalidParameterError, match="seed must be an integer in") as e:
            EngineConfig(seed=bad)
        assert e.value.param == "seed"


def test_generation_config_defaults_to_auto_and_must_be_a_non_empty_string():
    assert EngineConfig().generation_config == "auto"
    assert EngineConfig(generation_config="vllm").generation_config == "vllm"
    for bad in ("", None, 3):
        with pytest.raises(InvalidParameterError, match="generation_config must be 'auto', 'vllm' or a folder") as e:
            EngineConfig(generation_config=bad)
        assert e.value.param == "generation_config"


@pytest.mark.parametrize("device,said", [("nonsense", "device nonsense: not a device torch knows"),
                                         ("meta", "device meta: cinq's engine runs on cpu or cuda[:N], not meta")])
def test_a_device_the_engine_cannot_run_on_is_refused_by_the_config(device, said):
    # LLM(device=...) too: it was a traceback from inside the engine core
    with pytest.raises(InvalidParameterError) as e:
        EngineConfig(model="cinq-tiny", device=device)
    assert str(e.value).startswith(said) and e.value.param == "device"
