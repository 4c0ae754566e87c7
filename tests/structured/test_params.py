"""StructuredOutputsParams: one field, types and sizes checked, a canonical cache key; SamplingParams carries it
(a dict is accepted) and it survives the engine-core wire format."""

from __future__ import annotations

import pytest

from cinq import SamplingParams, StructuredOutputsParams
from cinq.engine.io import EngineCoreRequest
from cinq.engine.serial import ADD, decode, encode
from cinq.errors import InvalidParameterError


@pytest.mark.parametrize("kwargs, field", [
    ({}, "structured_outputs"),
    ({"json": {"type": "object"}, "regex": "a"}, "structured_outputs"),
    ({"json": "{not json"}, "structured_outputs.json"),
    ({"json": [1, 2]}, "structured_outputs.json"),
    ({"regex": ""}, "structured_outputs.regex"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"choice": ["a", 3]}, "structured_outputs.choice"),
    ({"grammar": 5}, "structured_outputs.grammar"),
    ({"regex": "a" * 70_000}, "structured_outputs.regex"),
])
def test_bad_params_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidParameterError) as e:
        StructuredOutputsParams(**kwargs)
    assert e.value.param == field


def test_key_keeps_property_order_and_sampling_params_take_a_dict() -> None:
    a = StructuredOutputsParams(json={"type": "object", "properties": {"b": {}, "a": {}}})
    assert a.key() == ("json", '{"type":"object","properties":{"b":{},"a":{}}}')
    assert StructuredOutputsParams(json_object=True).key() == ("json_object", "")
    sp = SamplingParams(structured_outputs={"choice": ["x", "y"]})
    assert sp.structured_outputs == StructuredOutputsParams(choice=["x", "y"])
    assert sp.clone(temperature=0.5).structured_outputs == sp.structured_outputs
    with pytest.raises(InvalidParameterError, match="structured_outputs"):
        SamplingParams(structured_outputs="json")


def test_round_trip_over_the_core_wire() -> None:
    for spec in (StructuredOutputsParams(json={"type": "object", "properties": {"n": {"type": "integer"}}}),
                 StructuredOutputsParams(json='{"type": "string"}'), StructuredOutputsParams(regex="[a-z]+"),
                 StructuredOutputsParams(choice=["a", "b"]), StructuredOutputsParams(json_object=True)):
        req = EngineCoreRequest("r", [1, 2], SamplingParams(structured_outputs=spec), 8, 0.0)
        kind, body = decode(encode(ADD, [req]))
        assert kind == ADD and body[0].sampling_params.structured_outputs == spec
