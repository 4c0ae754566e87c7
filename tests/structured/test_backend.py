"""compile_spec: each kind of constraint reaches the backend compiler it belongs to, with the text it needs (the
backends themselves are run in test_backends.py)."""

from __future__ import annotations

import json

import pytest

from cinq.structured.backend import compile_spec
from cinq.structured.params import StructuredOutputsParams


def _compiled(spec: StructuredOutputsParams) -> tuple[str, str]:
    return compile_spec(spec, lambda s: ("json_schema", s), lambda s: ("regex", s), lambda s: ("grammar", s),
                        start_rule="root ::=")


@pytest.mark.parametrize("spec,expected", [
    (StructuredOutputsParams(json={"type": "integer"}), ("json_schema", '{"type":"integer"}')),
    (StructuredOutputsParams(json_object=True), ("json_schema", json.dumps({"type": "object"}))),
    (StructuredOutputsParams(regex="a+"), ("regex", "a+")),
    (StructuredOutputsParams(choice=["yes", 'say "no"']), ("grammar", 'root ::= "yes" | "say \\"no\\""')),
    (StructuredOutputsParams(grammar='root ::= "x"'), ("grammar", 'root ::= "x"')),
])
def test_each_kind_reaches_its_compiler(spec, expected):
    assert _compiled(spec) == expected
