"""Fuzz of the constrained-decoding fields (beside the schemathesis run, which sees them only as free-form
objects): random JSON schemas built from the schema vocabulary with wrong and right values, random regexes and
grammars, through response_format, guided_* and structured_outputs. Each is a 200 or a 400 naming the field it
was sent in; never a 5xx; the server is healthy and idle after."""

from __future__ import annotations

import os

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.server.harness import MODEL_NAME, serve

EXAMPLES = int(os.environ.get("CINQ_FUZZ_STRUCTURED_EXAMPLES", "60"))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(-1e3, 1e3, allow_nan=False),
                     st.text(max_size=12))
_TYPES = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null", "nonsense"])
_REGEXISH = st.text(alphabet="ab01[](){}|*+?.^$\\-,:dws", max_size=16)


def _schemas():
    leaf = st.fixed_dictionaries({"type": _TYPES}, optional={
        "minLength": _SCALARS, "maxLength": st.integers(-2, 12), "pattern": _REGEXISH, "minimum": _SCALARS,
        "maximum": _SCALARS, "enum": st.lists(_SCALARS, max_size=4), "format": st.sampled_from(["date", "email",
                                                                                               "x"]),
        "const": _SCALARS, "$ref": st.sampled_from(["#/$defs/a", "#/nope", "http://x"])})
    return st.recursive(leaf, lambda inner: st.one_of(
        st.fixed_dictionaries({"type": st.just("object")}, optional={
            "properties": st.dictionaries(st.text(max_size=6), inner, max_size=3),
            "required": st.lists(st.text(max_size=6), max_size=3), "additionalProperties": st.booleans()}),
        st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                              optional={"minItems": st.integers(-1, 4), "maxItems": st.integers(-1, 4)}),
        st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"allOf": st.lists(inner, max_size=2)})), max_leaves=6)


_BODIES = st.one_of(
    st.builds(lambda s: ("response_format.json_schema.schema",
                         {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}}),
              _schemas()),
    st.builds(lambda s: ("guided_json", {"guided_json": s}), _schemas()),
    st.builds(lambda r: ("guided_regex", {"guided_regex": r}), _REGEXISH),
    st.builds(lambda g: ("structured_outputs.grammar", {"structured_outputs": {"grammar": g}}),
              st.one_of(st.text(max_size=30), st.builds(lambda b: f"root ::= {b}", st.text(
                  alphabet='"ab|()*+? []-', max_size=20)))),
    st.builds(lambda c: ("guided_choice", {"guided_choice": c}), st.lists(st.text(max_size=5), max_size=4)),
)


@pytest.fixture(scope="module")
def fuzz_server(tiny_llama):
    with serve(tiny_llama, max_model_len=64, max_num_seqs=16) as s:
        yield s


def test_random_constraints_get_200_or_a_400_naming_the_field(fuzz_server) -> None:
    url = fuzz_server.api + "/chat/completions"
    seen = {200: 0, 400: 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(_BODIES)
    def check(case) -> None:
        field, extra = case
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code in (200, 400), (r.status_code, r.text, body)
        seen[r.status_code] += 1
        if r.status_code == 400:
            param = r.json()["error"]["param"] or ""
            assert param.split(".")[0].split("[")[0] in (field.split(".")[0], "messages"), (param, body)

    check()
    assert seen[200] > 0 and seen[400] > 0, seen
    assert httpx.get(fuzz_server.url + "/health", timeout=10).json() == {"status": "ok"}
    stats = fuzz_server.wait_idle(timeout=60)
    assert stats["kv_cache_usage"] == 0 and stats["num_requests_running"] == 0
