"""server/tools.py: tool_choice checks, the Hermes <tool_call> format parsed (auto), the constraints of
required / named, prompts for templates without tools, and streamed deltas that add up to the whole reply."""

from __future__ import annotations

import json

import pytest

from cinq.errors import InvalidParameterError
from cinq.server.tools import ToolCallStreamer, prepare_messages, tool_plan

F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                  "properties": {"x": {"type": "integer"}}}}}
G = {"type": "function", "function": {"name": "g"}}


def test_auto_parses_calls_and_keeps_other_text() -> None:
    plan = tool_plan([F, G], "auto")
    content, calls = plan.parse('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n'
                                '<tool_call>{"name": "g", "arguments": {}}</tool_call> done')
    assert content == "done" and [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1}
    assert plan.parse("just text") == ("just text", [])
    assert plan.parse("<tool_call>{broken</tool_call>") == ("<tool_call>{broken</tool_call>", [])


def test_required_and_named_constrain_the_output() -> None:
    named = tool_plan([F, G], {"type": "function", "function": {"name": "f"}})
    assert named.constraint().json == F["function"]["parameters"]
    assert named.parse('{"x": 3}')[1][0]["function"] == {"name": "f", "arguments": '{"x": 3}'}
    required = tool_plan([F, G], "required")
    schema = required.constraint().json
    assert [s["properties"]["name"]["const"] for s in schema["anyOf"]] == ["f", "g"]
    assert required.parse('{"name": "g", "arguments": {}}')[1][0]["function"]["name"] == "g"
    assert tool_plan([F], "none").constraint() is None and tool_plan(None, None) is None


@pytest.mark.parametrize("tools, choice, field", [
    (None, "required", "tool_choice"), ([{"type": "x"}], None, "tools[0]"),
    ([{"type": "function", "function": {"name": ""}}], None, "tools[0].function.name"),
    ([F], "sometimes", "tool_choice"), ([F], {"type": "function", "function": {"name": "h"}},
                                        "tool_choice.function.name")])
def test_bad_tools_name_the_field(tools, choice, field) -> None:
    with pytest.raises(InvalidParameterError) as e:
        tool_plan(tools, choice)
    assert e.value.param == field


def test_templates_without_tools_get_a_system_prompt_and_calls_written_back() -> None:
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}]
    msgs, extra = prepare_messages(history, tool_plan([F], "auto"), template_renders_tools=False)
    assert msgs[0]["role"] == "system" and "<tools>" in msgs[0]["content"] and not extra
    assert msgs[2]["content"] == '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    msgs, extra = prepare_messages(history, tool_plan([F], "auto"), template_renders_tools=True)
    assert msgs == history and extra["tools"][0]["function"]["name"] == "f"


def _stream(plan, pieces: list[str]) -> list[dict]:
    s = ToolCallStreamer(plan)
    out = []
    for i, p in enumerate(pieces):
        out += s.feed(p, i == len(pieces) - 1)
    return out


def test_streamer_content_auto_and_named() -> None:
    auto = tool_plan([F], "auto")
    assert _stream(auto, ["Hel", "lo"]) == [{"content": "Hel"}, {"content": "lo"}]
    deltas = _stream(auto, [" <tool", '_call>{"name": "f", ', '"arguments": {}}</tool_call>'])
    assert len(deltas) == 1 and deltas[0]["tool_calls"][0]["function"]["name"] == "f"
    named = _stream(tool_plan([F], {"type": "function", "function": {"name": "f"}}), ['{"x"', ": 2}"])
    assert named[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in named) == '{"x": 2}'
