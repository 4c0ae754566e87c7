"""The device table and devices made from flags."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.plan.devices import DEVICES, custom_device, get_device


def test_lookup_is_case_insensitive_with_aliases():
    assert get_device("h100").name == "H100-80GB"
    assert get_device("this-cpu").is_cpu and get_device("EPYC-2vCPU").link_gbs is None


def test_unknown_device_lists_the_table():
    with pytest.raises(InvalidParameterError) as e:
        get_device("Z100")
    assert e.value.param == "device" and "H200" in str(e.value)


def test_flags_override_or_make_a_device():
    h100 = get_device("H100-80GB")
    cheap = custom_device(h100, price_per_hour=1.5)
    assert cheap.price_per_hour == 1.5 and cheap.bandwidth_gbs == h100.bandwidth_gbs
    own = custom_device(None, memory_gib=16, bandwidth_gbs=100, tflops=10)
    assert (own.memory_gib, own.bandwidth_gbs, own.tflops, own.link_gbs) == (16, 100, 10, None)
    with pytest.raises(InvalidParameterError) as e:
        custom_device(None, memory_gib=16)
    assert "--bandwidth-gbs" in str(e.value) and "--tflops" in str(e.value)


def test_figures_are_validated():
    with pytest.raises(InvalidParameterError) as e:
        custom_device(get_device("L4"), bandwidth_gbs=0)
    assert e.value.param == "bandwidth_gbs"
    with pytest.raises(InvalidParameterError):
        custom_device(get_device("L4"), price_per_hour=-1)


def test_table_is_internally_consistent():
    for d in DEVICES.values():
        assert d.memory_gib > 0 and d.bandwidth_gbs > 0 and d.tflops > 0
        assert d.is_cpu == (d.link_gbs is None)  # every GPU in the table has a link for tensor parallelism
