"""Constrained decoding in the engine (cinq-tiny): outputs valid against their schema, and every engine feature
kept: n > 1, stop strings, logprobs (of the constrained distribution), preemption, prefix caching, a bad spec
refused with the field named while the engine goes on."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

from cinq import LLM, SamplingParams, StructuredOutputsParams
from benchmarks.structured_schemas import schema_suite
from cinq.errors import InvalidParameterError

CHOICE = StructuredOutputsParams(choice=["alpha", "beta", "gamma delta"])


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("cinq-tiny", dtype="float32", seed=0)


def test_schema_outputs_are_valid(llm: LLM) -> None:
    schemas = schema_suite(12)
    params = [SamplingParams(temperature=0, max_tokens=96, structured_outputs=StructuredOutputsParams(json=s))
              for s in schemas]
    outs = llm.generate(["Give me a JSON record:"] * len(schemas), params)
    for schema, out in zip(schemas, outs):
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        jsonschema.validate(json.loads(out.outputs[0].text), schema)


def test_json_object_and_regex(llm: LLM) -> None:
    obj = llm.generate(["JSON:"], SamplingParams(temperature=0, max_tokens=64, structured_outputs=
                                                  StructuredOutputsParams(json_object=True)))[0].outputs[0]
    if obj.finish_reason == "stop":
        assert isinstance(json.loads(obj.text), dict)
    else:
        assert obj.text.startswith("{")
    rx = llm.generate(["Phone:"], SamplingParams(temperature=0, max_tokens=20, structured_outputs=
                                                  StructuredOutputsParams(regex=r"[0-9]{3}-[0-9]{4}")))[0].outputs[0]
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", rx.text) and rx.finish_reason == "stop"


def test_n_samples_each_follow_the_grammar(llm: LLM) -> None:
    out = llm.generate(["Pick one:"], SamplingParams(n=6, temperature=1.5, seed=3, max_tokens=10,
                                                     structured_outputs=CHOICE))[0]
    assert len(out.outputs) == 6 and all(c.text in CHOICE.choice for c in out.outputs)


def test_stop_strings_cut_a_constrained_output(llm: LLM) -> None:
    out = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=20, stop=["de"],
                                             structured_outputs=StructuredOutputsParams(regex="abc(de)+f")))[0]
    assert out.outputs[0].text == "abc" and out.outputs[0].finish_reason == "stop"


def test_logprobs_are_of_the_constrained_distribution(llm: LLM) -> None:
    out = llm.generate(["Pick:"], SamplingParams(temperature=0, max_tokens=10, logprobs=5,
                                                 structured_outputs=StructuredOutputsParams(choice=["yes", "no"])))
    comp = out[0].outputs[0]
    first = comp.logprobs[0]
    finite = [lp for lp in first.values() if math.isfinite(lp.logprob)]
    assert comp.text in ("yes", "no") and finite
    # every token with probability left is a start of a choice; the raw distribution would have many others
    assert all(lp.decoded_token and ("yes".startswith(lp.decoded_token) or "no".startswith(lp.decoded_token))
               for lp in finite)
    assert sum(math.exp(lp.logprob) for lp in finite) <= 1.0 + 1e-5


def test_preemption_and_prefix_cache_change_nothing() -> None:
    prompts = ["Give me a JSON record:", "Another record, please:"] * 3
    schemas = schema_suite(6)
    params = [SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=s))
              for s in schemas]
    roomy = [o.outputs[0].token_ids for o in LLM("cinq-tiny", dtype="float32").generate(prompts, params)]
    tight = LLM("cinq-tiny", dtype="float32", num_kv_blocks=24, block_size=4, max_num_batched_tokens=16)
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, params)] == roomy
    assert tight.engine.get_stats().num_preemptions > 0
    cached = LLM("cinq-tiny", dtype="float32", enable_prefix_caching=True)
    long_prompt = ["Here is a long instruction that fills several KV blocks. " * 6]
    first = cached.generate(long_prompt, params[:1])[0]
    again = cached.generate(long_prompt, params[:1])[0]
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == first.outputs[0].token_ids


def test_bad_specs_are_refused_and_the_engine_goes_on(llm: LLM) -> None:
    for spec, field in ((StructuredOutputsParams(regex="(unclosed"), "structured_outputs.regex"),
                        (StructuredOutputsParams(json={"type": "nonsense"}), "structured_outputs.json"),
                        (StructuredOutputsParams(grammar="root ::= ("), "structured_outputs.grammar")):
        with pytest.raises(InvalidParameterError) as e:
            llm.generate(["x"], SamplingParams(max_tokens=4, structured_outputs=spec))
        assert e.value.param == field
    assert llm.generate(["x"], SamplingParams(max_tokens=4, temperature=0))[0].outputs[0].token_ids
