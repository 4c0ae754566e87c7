"""Structured outputs and tool calls through the official `openai` client: response_format (json_object,
json_schema), parse() with a pydantic model, vLLM's extra body fields, and tool calls whole, streamed and in a
round trip (cinq-tiny: the outputs are checked against their schema with jsonschema)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from cinq.assets import resolve_model_path
from tests.server.harness import MODEL_NAME, RunningServer, serve

USER = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "role": {"enum": ["admin", "user"]}},
          "required": ["name", "age", "role"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                                       "required": ["zone"], "additionalProperties": False}}}


class Pet(BaseModel):
    name: str = Field(max_length=8)
    legs: int = Field(ge=0, le=8)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve(resolve_model_path("cinq-tiny"), max_num_seqs=16, dtype="float32") as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def test_response_format_json_schema_and_object(client) -> None:
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=80, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "person", "schema": PERSON}})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=80, temperature=0,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_parse_with_a_pydantic_model(client) -> None:
    r = client.chat.completions.parse(model=MODEL_NAME, messages=USER, max_tokens=80, temperature=0,
                                      response_format=Pet)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet) and 0 <= pet.legs <= 8


def test_vllm_extra_body_fields(client) -> None:
    r = client.completions.create(model=MODEL_NAME, prompt="Answer:", max_tokens=10, temperature=0,
                                  extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].text in ("yes", "no")
    r = client.completions.create(model=MODEL_NAME, prompt="Code:", max_tokens=12, temperature=0,
                                  extra_body={"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}})
    assert len(r.choices[0].text) == 6 and r.choices[0].text[2] == "-"
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=80, temperature=0,
                                       extra_body={"guided_json": PERSON})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_tool_call_round_trip(client) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=[WEATHER, TIME], max_tokens=60,
                                       temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    final = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=[WEATHER, TIME],
                                           tool_choice="none", max_tokens=8, temperature=0)
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content is not None


def test_required_tool_choice_calls_one_of_the_tools(client) -> None:
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Time?"}],
                                       tools=[WEATHER, TIME], tool_choice="required", max_tokens=60, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_streamed_tool_calls_assemble_to_the_whole_reply(client, tool_choice) -> None:
    kw = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER, TIME],
              tool_choice=tool_choice, max_tokens=60, temperature=0)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    name, args, finish = None, "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                name = tc.function.name or name
                args += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert (name, json.loads(args), finish) == (whole.function.name, json.loads(whole.function.arguments),
                                                "tool_calls")
