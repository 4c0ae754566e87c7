"""QuantFormat <-> quantization_config, validation, and the linear factory."""

from __future__ import annotations

import pytest

import torch

from cinq.errors import ModelLoadError
from cinq.layers.linear import DenseLinear, make_linear
from cinq.layers.quantization.format import QuantFormat
from cinq.layers.quantization.linear import AWQLinear, GPTQLinear, W8A8Linear


@pytest.mark.parametrize("cfg", [
    QuantFormat("gptq", 4, 128, desc_act=True, static_groups=True),
    QuantFormat("rtn", 8, -1, sym=False, format="gptq_v2"),
    QuantFormat("awq", 4, 64, sym=False),
    QuantFormat("smoothquant", 8, -1, act_scheme="static"),
])
def test_hf_round_trip(cfg):
    back = QuantFormat.from_hf(cfg.to_hf())
    for field in ("method", "bits", "group_size", "sym", "format", "desc_act", "static_groups", "act_scheme"):
        assert getattr(back, field) == getattr(cfg, field), field


def test_awq_config_and_autoawq_spelling():
    hf = QuantFormat("awq", 4, 128, sym=False).to_hf()
    assert hf["quant_method"] == "awq" and hf["version"] == "gemm" and hf["zero_point"] is True
    legacy = QuantFormat.from_hf({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": True,
                                  "version": "GEMM"})
    assert legacy.group_size == 64 and legacy.format == "awq" and not legacy.sym


def test_third_party_gptq_config_defaults():
    cfg = QuantFormat.from_hf({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True})
    assert cfg.method == "gptq" and cfg.format == "gptq" and cfg.sym and cfg.desc_act
    v2 = QuantFormat.from_hf({"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "gptq_v2"})
    assert v2.format == "gptq_v2"


@pytest.mark.parametrize("qc,field", [
    ({"quant_method": "gptq", "bits": 5, "group_size": 128}, "bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "checkpoint_format"),
    ({"quant_method": "hqq"}, "quant_method"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "load_in_4bit"),  # LLM.int8: not read
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "fp4"}, "bnb_4bit_quant_type"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}}, "format"),
])
def test_unsupported_configs_are_clear_errors(qc, field):
    with pytest.raises(ModelLoadError) as e:
        QuantFormat.from_hf(qc)
    assert e.value.param == field and field in str(e.value)


def test_factory_builds_the_format_linear_and_skips_listed_modules():
    cfg = QuantFormat("gptq", 4, 32, modules_to_not_convert=["mlp.down_proj"])
    f32 = torch.float32
    assert isinstance(make_linear(64, 32, False, cfg, "model.layers.0.self_attn.q_proj", f32), GPTQLinear)
    assert isinstance(make_linear(64, 32, False, cfg, "model.layers.0.mlp.down_proj", f32), DenseLinear)
    assert isinstance(QuantFormat("awq", 4, 32).make_linear(64, 32, True, "x", f32), AWQLinear)
    lin = QuantFormat("smoothquant", 8, -1, act_scheme="static").make_linear(64, 32, False, "x", f32)
    assert isinstance(lin, W8A8Linear) and lin.static


def test_compute_dtype_is_explicit_not_the_default_dtype():
    lin = QuantFormat("gptq", 4, 32).make_linear(64, 32, True, "x", torch.bfloat16)
    assert lin.compute_dtype == torch.bfloat16 and torch.get_default_dtype() == torch.float32
    assert lin.bias.dtype == torch.bfloat16


def test_lm_head_is_quantized_only_with_the_flag():
    assert not QuantFormat("gptq", 4, 32).quantizes("lm_head")
    assert QuantFormat("gptq", 4, 32, lm_head=True).quantizes("lm_head")
    assert not QuantFormat("gptq", 4, 32, modules_to_not_convert=["mlp"]).quantizes("model.layers.0.mlp.up_proj")
