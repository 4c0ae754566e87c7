"""A whole plan: fit, TP degree, speeds and the sweep."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.plan.cost import dollars_per_million_tokens
from cinq.plan.devices import get_device
from cinq.plan.memory import Precision
from cinq.plan.planner import PlanSettings, build_plan
from cinq.plan.roofline import decode_tokens_per_s
from cinq.plan.shapes import resolve_shape

BF16 = Precision.from_name("bfloat16")


def test_70b_bf16_picks_tp2_on_h100_and_sweeps():
    shape, h100 = resolve_shape("Llama-3-70B"), get_device("H100-80GB")
    plan = build_plan(shape, h100, BF16, PlanSettings(max_model_len=8192, concurrency=64))
    assert plan.tensor_parallel_size == plan.min_tensor_parallel_size == 2 and plan.memory.fits
    assert [r.tensor_parallel_size for r in plan.tp_sweep] == [1, 2, 4, 8]
    assert [r.fits for r in plan.tp_sweep] == [False, True, True, True]
    # the concurrency is capped by what the KV cache holds at TP 2
    assert plan.at_concurrency.batch == plan.memory.max_num_sequences < 64
    assert plan.batch1.tokens_per_s == pytest.approx(decode_tokens_per_s(shape.config, BF16, h100, 1, 8192, 2))
    assert plan.batch1.dollars_per_million == pytest.approx(
        dollars_per_million_tokens(plan.batch1.tokens_per_s, 2.99, 2))
    # more cards: more KV room and faster batch-1 decode
    seqs = [r.max_num_sequences for r in plan.tp_sweep]
    speeds = [r.batch1.tokens_per_s for r in plan.tp_sweep[1:]]
    assert seqs == sorted(seqs) and speeds == sorted(speeds)


def test_explicit_tp_that_does_not_fit_has_no_speeds():
    plan = build_plan(resolve_shape("Llama-3-70B"), get_device("H100-80GB"), BF16,
                      PlanSettings(max_model_len=8192, tensor_parallel_size=1))
    assert not plan.memory.fits and plan.batch1 is None and plan.at_concurrency is None
    assert plan.min_tensor_parallel_size == 2


def test_cpu_has_no_tensor_parallelism():
    cpu = get_device("EPYC-2vCPU")
    plan = build_plan(resolve_shape("cinq-tiny"), cpu, BF16, PlanSettings(max_model_len=2048, concurrency=4))
    assert plan.tensor_parallel_size == 1 and plan.tp_sweep == [] and plan.at_concurrency.batch == 4
    too_big = build_plan(resolve_shape("Llama-3-70B"), cpu, BF16, PlanSettings(max_model_len=8192))
    assert too_big.min_tensor_parallel_size is None and not too_big.memory.fits
    with pytest.raises(InvalidParameterError) as e:
        build_plan(resolve_shape("cinq-tiny"), cpu, BF16, PlanSettings(max_model_len=512, tensor_parallel_size=2))
    assert e.value.param == "tensor_parallel_size"


def test_tp_must_divide_the_heads():
    with pytest.raises(InvalidParameterError) as e:
        build_plan(resolve_shape("Llama-3-8B"), get_device("H100-80GB"), BF16,
                   PlanSettings(max_model_len=8192, tensor_parallel_size=3))
    assert e.value.param == "tensor_parallel_size" and "32" in str(e.value)


def test_a_context_past_the_model_is_refused_as_the_engine_refuses_it():
    with pytest.raises(InvalidParameterError, match=r"max_model_len \(1000000\) exceeds what the model supports"):
        build_plan(resolve_shape("Llama-3-8B"), get_device("H100-80GB"), BF16, PlanSettings(max_model_len=1_000_000))


@pytest.mark.parametrize("field, kwargs", [("max_model_len", {"max_model_len": 0}),
                                           ("concurrency", {"concurrency": 0}),
                                           ("gpu_memory_utilization", {"gpu_memory_utilization": 1.5}),
                                           ("tensor_parallel_size", {"tensor_parallel_size": 0}),
                                           ("context_len", {"context_len": 2048})])
def test_settings_are_validated(field, kwargs):
    with pytest.raises(InvalidParameterError) as e:
        PlanSettings(**({"max_model_len": 1024} | kwargs))
    assert e.value.param == field


def test_shorter_decode_context_reads_less_kv_but_sizes_memory_at_max_model_len():
    shape, h100 = resolve_shape("Llama-3-8B"), get_device("H100-80GB")
    full = build_plan(shape, h100, BF16, PlanSettings(max_model_len=8192, concurrency=32))
    short = build_plan(shape, h100, BF16, PlanSettings(max_model_len=8192, concurrency=32, context_len=512))
    assert short.memory == full.memory  # the KV cache is sized for max_model_len either way
    assert short.at_concurrency.tokens_per_s == pytest.approx(
        decode_tokens_per_s(shape.config, BF16, h100, 32, 512))
    assert short.at_concurrency.tokens_per_s > full.at_concurrency.tokens_per_s
    assert short.prefill_ttft_s < full.prefill_ttft_s
