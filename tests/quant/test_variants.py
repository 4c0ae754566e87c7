"""The variant grid of `cinq eval --variants`: parsing, labels, and skipping what a method or shape cannot do."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.quant.variants import CHANNEL, VariantSpec, parse_group_sizes, parse_variants, split_supported
from tests.quant.conftest import tiny_config

STUDY = "rtn:8,4,3,2;gptq:8,4,3,2;awq:4;smoothquant:static,dynamic"


def test_the_study_grid():
    groups = parse_group_sizes("channel,128,64,32")
    assert groups == [CHANNEL, 128, 64, 32]
    specs, skipped = parse_variants(STUDY, groups)
    assert len(specs) == 4 * 4 + 4 * 4 + 4 + 2
    assert specs[0] == VariantSpec("rtn", 8, CHANNEL) and specs[0].label == "rtn-w8-ch"
    assert specs[5].label == "rtn-w4-g128"
    assert [s.label for s in specs[-2:]] == ["smoothquant-w8a8-static", "smoothquant-w8a8-dynamic"]
    assert len({s.label for s in specs}) == len(specs)
    assert len(skipped) == 1 and "per output channel" in skipped[0][1]  # SmoothQuant has no group sizes


def test_entries_pin_groups_and_modifiers_and_dedupe():
    specs, _ = parse_variants("gptq:4/128+act,3/channel+asym;rtn:4,4", [64])
    assert [s.label for s in specs] == ["gptq-w4-g128-act", "gptq-w3-ch-asym", "rtn-w4-g64"]
    assert specs[0].quant_config().desc_act and not specs[1].quant_config().sym
    awq, _ = parse_variants("awq:4", [32])
    assert not awq[0].quant_config().sym  # AWQ's default grid has zero points


def test_unsupported_variants_are_skipped_with_reasons_not_errors():
    specs, skipped = parse_variants("awq:8,4;smoothquant:4;rtn:5,3", [CHANNEL, 32])
    assert ("smoothquant:4", "SmoothQuant is W8A8 (8-bit weights and activations) only") in skipped
    narrow = tiny_config(hidden=48, inter=96, heads=3, kv_heads=3)  # 48 channels cannot pack 3-bit (32 per unit)
    ok, skipped = split_supported(specs, narrow)
    reasons = dict(skipped)
    assert "4-bit weights only" in reasons["awq-w8-ch"] and "4-bit weights only" in reasons["awq-w8-g32"]
    assert "bits must be one of 2, 3, 4, 8" in reasons["rtn-w5-ch"]
    assert "multiples of 32" in reasons["rtn-w3-ch"]
    assert "not a multiple of group_size 32" in reasons["awq-w4-g32"]  # AWQ files need whole groups
    assert {s.label for s in ok} == {"awq-w4-ch"}
    ok_wide, _ = split_supported(specs, tiny_config(hidden=64, inter=128))
    assert {"rtn-w3-ch", "rtn-w3-g32"} <= {s.label for s in ok_wide}


@pytest.mark.parametrize("text", ["nf4:4", "rtn", "rtn:", "rtn:four", "smoothquant:fast", "gptq:4+fast"])
def test_malformed_variants_name_the_option(text):
    with pytest.raises(InvalidParameterError) as e:
        parse_variants(text, [CHANNEL])
    assert e.value.param == "variants" and "--variants" in str(e.value)


@pytest.mark.parametrize("text", ["", "0", "x", "128,-5"])
def test_malformed_group_sizes(text):
    with pytest.raises(InvalidParameterError) as e:
        parse_group_sizes(text)
    assert e.value.param == "group_sizes"
