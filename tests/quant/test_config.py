"""QuantConfig <-> quantization_config, validation, and the linear factory."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.layers.linear import AWQLinear, DenseLinear, GPTQLinear, W8A8Linear
from cinq.quant.config import QuantConfig


@pytest.mark.parametrize("cfg", [
    QuantConfig("gptq", 4, 128, desc_act=True, static_groups=True),
    QuantConfig("rtn", 8, -1, sym=False, format="gptq_v2"),
    QuantConfig("awq", 4, 64, sym=False),
    QuantConfig("smoothquant", 8, -1, act_scheme="static", smooth_alpha=0.8),
])
def test_hf_round_trip(cfg):
    back = QuantConfig.from_hf(cfg.to_hf())
    for field in ("method", "bits", "group_size", "sym", "format", "desc_act", "static_groups", "act_scheme"):
        assert getattr(back, field) == getattr(cfg, field), field


def test_gptq_config_has_the_fields_autogptq_writes():
    hf = QuantConfig("gptq", 4, 128).to_hf()
    assert hf["quant_method"] == "gptq" and hf["checkpoint_format"] == "gptq"
    for key in ("bits", "group_size", "desc_act", "sym", "static_groups", "true_sequential", "damp_percent"):
        assert key in hf
    qc = QuantConfig("gptq", 4, 128).quantize_config_json()
    assert qc is not None and "quant_method" not in qc and qc["bits"] == 4
    assert QuantConfig("awq", 4, 128).quantize_config_json() is None


def test_awq_config_and_autoawq_spelling():
    hf = QuantConfig("awq", 4, 128, sym=False).to_hf()
    assert hf["quant_method"] == "awq" and hf["version"] == "gemm" and hf["zero_point"] is True
    legacy = QuantConfig.from_hf({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": True,
                                  "version": "GEMM"})
    assert legacy.group_size == 64 and legacy.format == "awq" and not legacy.sym


def test_third_party_gptq_config_defaults():
    cfg = QuantConfig.from_hf({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True})
    assert cfg.method == "gptq" and cfg.format == "gptq" and cfg.sym and cfg.desc_act
    v2 = QuantConfig.from_hf({"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "gptq_v2"})
    assert v2.format == "gptq_v2"


@pytest.mark.parametrize("qc,field", [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "checkpoint_format"),
    ({"quant_method": "bitsandbytes"}, "quant_method"),
])
def test_unsupported_configs_are_clear_errors(qc, field):
    with pytest.raises(ModelLoadError) as e:
        QuantConfig.from_hf(qc)
    assert e.value.param == field and field in str(e.value)


@pytest.mark.parametrize("kwargs,field", [
    ({"method": "nf4"}, "method"), ({"method": "awq", "bits": 8}, "bits"),
    ({"method": "gptq", "damp_percent": 0.0}, "damp_percent"), ({"method": "smoothquant", "bits": 4}, "bits"),
    ({"method": "smoothquant", "act_scheme": "per_group"}, "act_scheme"),
    ({"method": "awq", "desc_act": True}, "desc_act"), ({"method": "gptq", "format": "w8a8"}, "format"),
])
def test_invalid_settings_name_the_field(kwargs, field):
    with pytest.raises(InvalidParameterError) as e:
        QuantConfig(**kwargs)
    assert e.value.param == field


def test_factory_builds_the_format_linear_and_skips_listed_modules():
    cfg = QuantConfig("gptq", 4, 32, modules_to_not_convert=["mlp.down_proj"])
    assert isinstance(cfg.make_linear(64, 32, False, "model.layers.0.self_attn.q_proj"), GPTQLinear)
    assert isinstance(cfg.make_linear(64, 32, False, "model.layers.0.mlp.down_proj"), DenseLinear)
    assert isinstance(QuantConfig("awq", 4, 32).make_linear(64, 32, True, "x"), AWQLinear)
    lin = QuantConfig("smoothquant", 8, -1, act_scheme="static").make_linear(64, 32, False, "x")
    assert isinstance(lin, W8A8Linear) and lin.static
