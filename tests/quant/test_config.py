"""QuantConfig (a quantization job: target format + recipe): validation names the field; the recipe's recorded
settings go into quantization_config and come back."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.quant.config import QuantConfig
from cinq.quant.recipe import QuantRecipe


@pytest.mark.parametrize("kwargs,field", [
    ({"method": "hqq"}, "method"), ({"method": "awq", "bits": 8}, "bits"),
    ({"method": "nf4", "group_size": 32}, "group_size"), ({"method": "nf4", "bits": 8}, "bits"),
    ({"method": "fp8", "act_scheme": "per_group"}, "act_scheme"), ({"method": "fp8", "weight_strategy": "group"},
                                                                   "weight_strategy"),
    ({"method": "fp8", "act_scheme": "none", "format": "fp8"}, "format"),
    ({"method": "gptq", "damp_percent": 0.0}, "damp_percent"), ({"method": "smoothquant", "bits": 4}, "bits"),
    ({"method": "smoothquant", "act_scheme": "per_group"}, "act_scheme"),
    ({"method": "awq", "desc_act": True}, "desc_act"), ({"method": "gptq", "format": "w8a8"}, "format"),
    ({"method": "gptq", "lazy_batch_size": 0}, "lazy_batch_size"),
])
def test_invalid_settings_name_the_field(kwargs, field):
    with pytest.raises(InvalidParameterError) as e:
        QuantConfig(**kwargs)
    assert e.value.param == field


def test_recipe_settings_are_recorded_and_read_back():
    cfg = QuantConfig("gptq", 4, 128, damp_percent=0.05, true_sequential=False)
    hf = cfg.to_hf()
    assert hf["damp_percent"] == 0.05 and hf["true_sequential"] is False and hf["checkpoint_format"] == "gptq"
    back = QuantConfig.from_hf(hf)
    assert back.recipe.damp_percent == 0.05 and not back.recipe.true_sequential
    sq = QuantConfig("smoothquant", smooth_alpha=0.8).to_hf()
    assert sq["smoothquant_alpha"] == 0.8
    assert QuantConfig.from_hf(sq).recipe.smooth_alpha == 0.8
    assert QuantRecipe().recorded("awq") == {}


def test_gptq_config_has_the_fields_autogptq_writes():
    hf = QuantConfig("gptq", 4, 128).to_hf()
    assert hf["quant_method"] == "gptq" and hf["checkpoint_format"] == "gptq"
    for key in ("bits", "group_size", "desc_act", "sym", "static_groups", "true_sequential", "damp_percent"):
        assert key in hf
    qc = QuantConfig("gptq", 4, 128).quantize_config_json()
    assert qc is not None and "quant_method" not in qc and qc["bits"] == 4
    assert QuantConfig("awq", 4, 128).quantize_config_json() is None


def test_the_lm_head_stays_dense_by_default():
    """Quantizing the head (round-to-nearest) doubled a real model's perplexity loss: jobs leave it dense unless
    they ask, as do `cinq eval --variants` studies."""
    from cinq.quant.variants import parse_variants
    assert QuantConfig("gptq", 4, 128).lm_head is False and QuantConfig("gptq", 4, 128).to_hf()["lm_head"] is False
    specs, _ = parse_variants("rtn:4;gptq:4+act;awq:4", [128])
    assert [s.quant_config().lm_head for s in specs] == [False, False, False]
    assert QuantConfig("gptq", 4, 128, lm_head=True).to_hf()["lm_head"] is True
