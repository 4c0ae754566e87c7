"""Roofline decode / prefill speeds, crossover batch and the all-reduce model, against hand-computed values."""

from __future__ import annotations

import math

import pytest

from cinq.errors import InvalidParameterError
from cinq.plan.devices import get_device
from cinq.plan.memory import Precision, weight_bytes
from cinq.plan.roofline import (allreduce_seconds, crossover_batch, decode_step, decode_tokens_per_s,
                                matrix_weights, prefill_step)
from cinq.plan.shapes import resolve_shape

BF16 = Precision.from_name("bfloat16")
H100 = get_device("H100-80GB")


def test_batch1_is_bandwidth_over_bytes_per_token():
    cfg = resolve_shape("Llama-3-8B").config
    # bf16 weights less the untied input embedding (only one row of it is read)
    read = 2 * 8_030_261_248 - 2 * 128256 * 4096
    assert decode_tokens_per_s(cfg, BF16, H100, 1, 0) == pytest.approx(3350e9 / read)
    # with 1000 tokens of context the 128 KiB per token are read too
    assert decode_tokens_per_s(cfg, BF16, H100, 1, 1000) == pytest.approx(3350e9 / (read + 1000 * 131072))
    assert decode_step(cfg, BF16, H100, 1, 1000).bound == "memory"


def test_int4_reads_fewer_bytes_and_decodes_faster():
    cfg = resolve_shape("Llama-3-8B").config
    int4 = Precision.from_name("int4")
    ratio = decode_tokens_per_s(cfg, int4, H100, 1, 0) / decode_tokens_per_s(cfg, BF16, H100, 1, 0)
    assert ratio == pytest.approx(weight_bytes(cfg, BF16).read_per_step / weight_bytes(cfg, int4).read_per_step)
    assert 2.5 < ratio < 4.0


def test_crossover_batch_is_where_compute_overtakes_memory():
    cfg = resolve_shape("Llama-3-8B").config
    b = crossover_batch(cfg, BF16, H100, 0)
    # weights only: bytes / bandwidth = B * 2 * matrix weights / peak
    exact = weight_bytes(cfg, BF16).read_per_step / 3350e9 / (2 * matrix_weights(cfg) / 989e12)
    assert b == math.ceil(exact) and 280 < b < 300  # ~ peak / bandwidth for bf16
    assert decode_step(cfg, BF16, H100, b, 0).bound == "compute"
    assert decode_step(cfg, BF16, H100, b - 1, 0).bound == "memory"
    # at 8k context the KV reads (128 KiB per token per sequence) grow faster than the FLOPs: never
    assert crossover_batch(cfg, BF16, H100, 8192) is None


def test_allreduce_model():
    assert allreduce_seconds(H100, 1, 1e9) == 0.0
    assert allreduce_seconds(H100, 8, 8192.0) == pytest.approx(10e-6 + 2 * 7 / 8 * 8192 / 450e9)
    with pytest.raises(InvalidParameterError) as e:
        allreduce_seconds(get_device("EPYC-2vCPU"), 2, 1.0)
    assert e.value.param == "tensor_parallel_size"


def test_tensor_parallel_splits_bytes_and_adds_two_allreduces_per_layer():
    cfg = resolve_shape("Llama-3-70B").config
    one, eight = decode_step(cfg, BF16, H100, 1, 0, 1), decode_step(cfg, BF16, H100, 1, 0, 8)
    assert eight.memory_s == pytest.approx(one.memory_s / 8)
    assert eight.comm_s == pytest.approx(2 * 80 * allreduce_seconds(H100, 8, 8192 * 2))
    assert eight.seconds == pytest.approx(one.memory_s / 8 + eight.comm_s)


def test_prefill_is_compute_bound_with_causal_attention():
    cfg = resolve_shape("Llama-3-8B").config
    p = prefill_step(cfg, BF16, H100, 4096)
    flops = 2 * matrix_weights(cfg) * 4096 + 2 * 32 * 4096 ** 2 * 4096
    assert p.bound == "compute" and p.compute_s == pytest.approx(flops / 989e12)
