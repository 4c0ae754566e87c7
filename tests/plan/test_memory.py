"""Weights, KV and fit, against hand-computed values and against the bytes cinq's loader allocates."""

from __future__ import annotations

import dataclasses

import pytest

from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.model.tp_layout import check_divisible
from cinq.plan.devices import get_device
from cinq.plan.memory import (GIB, Precision, activation_bytes, kv_bytes_per_token, linear_bytes,
                              min_tensor_parallel_size, param_count, plan_memory, valid_tp_sizes, weight_bytes)
from cinq.plan.shapes import resolve_shape

BF16 = Precision.from_name("bfloat16")


def test_llama3_8b_kv_per_token_is_128_kib():
    cfg = resolve_shape("Llama-3-8B").config
    assert kv_bytes_per_token(cfg, BF16) == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert kv_bytes_per_token(cfg, Precision.from_name("int4")) == 128 * 1024  # KV stays bf16
    assert kv_bytes_per_token(cfg, Precision.from_name("float32")) == 256 * 1024
    assert kv_bytes_per_token(cfg, BF16, tensor_parallel_size=4) == 32 * 1024
    # fewer KV heads (8) than cards (16): one head per card, replicated
    assert kv_bytes_per_token(cfg, BF16, tensor_parallel_size=16) == 2 * 32 * 1 * 128 * 2


def test_llama3_70b_bf16_weights_by_hand():
    cfg = resolve_shape("Llama-3-70B").config
    embed = 128256 * 8192
    layer = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192  # q, o; k, v; MLP; 2 norms
    params = 2 * embed + 80 * layer + 8192
    assert param_count(cfg) == params == 70_553_706_496
    w = weight_bytes(cfg, BF16)
    assert w.total == 2 * params and 140e9 < w.total < 142e9  # "~141 GB"
    assert w.read_per_step == w.total - 2 * embed  # the untied input embedding is only gathered


def test_tied_embedding_counted_once_and_read_as_the_head():
    cfg = resolve_shape("Qwen2.5-0.5B").config
    w = weight_bytes(cfg, BF16)
    assert w.lm_head == 0 and w.read_per_step == w.total


def test_int4_linear_bytes_by_hand():
    # qweight K*N/2 + qzeros groups*N/2 + fp16 scales groups*N*2 + int32 g_idx K
    g = 4096 // 128
    assert linear_bytes(4096, 4096, Precision.from_name("int4")) == \
        4096 * 4096 // 2 + g * 4096 // 2 + g * 4096 * 2 + 4096 * 4
    per_channel = Precision.from_name("int8")
    assert per_channel.group_size == -1
    assert linear_bytes(1024, 512, per_channel) == 1024 * 512 + 512 + 512 * 2 + 1024 * 4


def test_precision_names_and_errors():
    assert Precision.from_name("int4").group_size == 128 and Precision.from_name("int4", 64).group_size == 64
    assert not BF16.quantized and Precision.from_name("int8").quantized
    with pytest.raises(InvalidParameterError) as e:
        Precision.from_name("int3")
    assert e.value.param == "dtype"
    with pytest.raises(InvalidParameterError) as e:
        Precision.from_name("int4", 0)
    assert e.value.param == "group_size"
    with pytest.raises(InvalidParameterError) as e:
        Precision.from_name("bfloat16", 128)  # groups only mean something for integer weights
    assert e.value.param == "group_size"


def _tiny(**overrides) -> ModelConfig:
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 128}
    return ModelConfig.from_dict(cfg | overrides)


@pytest.mark.parametrize("overrides, dtype", [
    ({}, "bfloat16"),
    ({"tie_word_embeddings": True}, "float32"),
    ({"architectures": ["Qwen2ForCausalLM"]}, "bfloat16"),  # qkv bias
    ({"architectures": ["Qwen3ForCausalLM"], "head_dim": 32}, "bfloat16"),  # q/k norm, head_dim != hidden/heads
    ({"mlp_bias": True}, "bfloat16"),
])
def test_dense_bytes_match_the_loaders_meta_model(overrides, dtype):
    import torch

    from cinq.model.loader import build_empty_model
    from cinq.model.memory import tensor_bytes
    cfg = _tiny(**overrides)
    model = build_empty_model(cfg, getattr(torch, dtype), "meta")
    model.tie_weights()
    assert weight_bytes(cfg, Precision.from_name(dtype)).total == tensor_bytes(model)


@pytest.mark.parametrize("bits, group", [(4, 32), (4, -1), (8, 64)])
def test_quantized_bytes_match_the_loaders_gptq_buffers(bits, group):
    import torch

    from cinq.model.loader import build_empty_model
    from cinq.model.memory import tensor_bytes
    qc = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": False, "sym": True}
    cfg = _tiny(quantization_config=qc)
    model = build_empty_model(cfg, torch.bfloat16, "meta")
    precision = Precision.from_quantization_config(qc)
    assert (precision.bits, precision.group_size) == (bits, group)
    assert weight_bytes(cfg, precision).total == tensor_bytes(model)


def test_llama3_70b_bf16_does_not_fit_one_80gb_card_and_needs_tp2():
    cfg, h100 = resolve_shape("Llama-3-70B").config, get_device("H100-80GB")
    one = plan_memory(cfg, BF16, h100.memory_gib, h100.reserved_gib, 8192)
    assert not one.fits and one.kv_budget < 0 and one.max_num_sequences == 0
    assert min_tensor_parallel_size(cfg, BF16, h100.memory_gib, h100.reserved_gib, 8192) == 2
    two = plan_memory(cfg, BF16, h100.memory_gib, h100.reserved_gib, 8192, tensor_parallel_size=2)
    assert two.fits and two.weights == weight_bytes(cfg, BF16).total // 2
    # int4 weights (~40 GB) fit one card
    assert min_tensor_parallel_size(cfg, Precision.from_name("int4"), h100.memory_gib, h100.reserved_gib,
                                    8192) == 1


def test_max_sequences_by_hand():
    cfg = resolve_shape("Llama-3-8B").config
    m = plan_memory(cfg, BF16, memory_gib=40, reserved_gib=1, max_model_len=4096, gpu_memory_utilization=0.5,
                    max_num_batched_tokens=512, max_num_seqs=16)
    usable = int(40 * GIB * 0.5 - 1 * GIB)
    act = activation_bytes(cfg, BF16, 512, 16)
    budget = usable - weight_bytes(cfg, BF16).total - act
    assert m.kv_budget == budget
    assert m.max_num_sequences == budget // (4096 * 128 * 1024)
    assert m.kv_tokens == budget // (128 * 1024)


def test_activation_estimate_by_hand():
    cfg = resolve_shape("Llama-3-8B").config
    per_token = (2 * 4096 + (4096 + 2 * 1024) + 4096 + 3 * 14336) * 2
    assert activation_bytes(cfg, BF16, 100, 8) == 100 * per_token + 8 * 128256 * 4 * 2


def test_valid_tp_sizes_divide_the_heads():
    assert valid_tp_sizes(resolve_shape("Qwen2.5-7B").config) == [1, 2, 4]  # 28 heads
    assert valid_tp_sizes(resolve_shape("Llama-3-70B").config, limit=8) == [1, 2, 4, 8]


def test_valid_tp_sizes_are_the_ones_the_loader_accepts():
    cfg = dataclasses.replace(resolve_shape("Llama-3-8B").config, intermediate_size=4 * 3000 + 4)  # MLP: 4 ranks
    assert valid_tp_sizes(cfg) == [1, 2, 4]
    for tp in (8, 16):
        with pytest.raises(InvalidParameterError, match="intermediate_size"):
            check_divisible(cfg, tp)
