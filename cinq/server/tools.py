"""Tool calls for /v1/chat/completions (OpenAI's ``tools`` / ``tool_choice``).

The model's tool-call format is the Hermes one that SmolLM2 and Qwen use: ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``. A chat template that renders ``tools`` itself gets them; for one that does not (SmolLM2-135M,
cinq-tiny) the tools are described in a system message in that format. ``tool_choice``:
- ``none``: no tools offered, plain content;
- ``auto``: tools offered; ``<tool_call>`` blocks at the start of the reply are parsed into ``tool_calls``;
- ``required``: the reply is constrained to one call, ``{"name": <a tool>, "arguments": <its parameters>}``;
- a named function: the reply is constrained to that function's parameters schema (its arguments).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.structured.params import StructuredOutputsParams

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_ANY_OBJECT = {"type": "object"}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class ToolPlan:
    """What the request asked of tools: ``choice`` is none / auto / required / named."""

    choice: str
    functions: list[dict[str, Any]]  # each {"name", "description"?, "parameters"?}
    named: str | None = None

    def constraint(self) -> StructuredOutputsParams | None:
        """The output constraint ``required`` and a named function need (None otherwise)."""
        if self.choice == "named":
            fn = next(f for f in self.functions if f["name"] == self.named)
            return StructuredOutputsParams(json=fn.get("parameters") or _ANY_OBJECT)
        if self.choice == "required":
            calls = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                       "arguments": f.get("parameters") or _ANY_OBJECT},
                      "required": ["name", "arguments"], "additionalProperties": False} for f in self.functions]
            return StructuredOutputsParams(json=calls[0] if len(calls) == 1 else {"anyOf": calls})
        return None

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls) of a finished reply; unparseable text stays content."""
        if self.choice == "named":
            return None, [_call(self.named or "", text)]
        if self.choice == "required":
            try:
                obj = json.loads(text)
                return None, [_call(obj["name"], json.dumps(obj["arguments"], ensure_ascii=False))]
            except (ValueError, KeyError, TypeError):
                return text, []
        if self.choice != "auto" or OPEN not in text:
            return text, []
        calls = []
        for m in _CALL.finditer(text):
            try:
                obj = json.loads(m.group(1))
                name, args = obj["name"], obj.get("arguments", obj.get("parameters", {}))
            except (ValueError, KeyError, TypeError):
                return text, []
            if not isinstance(name, str):
                return text, []
            calls.append(_call(name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
        if not calls:
            return text, []
        rest = _CALL.sub("", text).strip()
        return rest or None, calls


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_plan(tools: list[Any] | None, tool_choice: Any) -> ToolPlan | None:
    """Check ``tools`` and ``tool_choice`` (errors name the field) and say what to do; None: no tools."""
    if tool_choice is not None and not tools and tool_choice != "none":
        raise InvalidParameterError("tool_choice needs tools", "tool_choice")
    if not tools:
        return None
    functions = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"),
                                                                                                  dict):
            raise InvalidParameterError("each tool must be {'type': 'function', 'function': {...}}", f"tools[{i}]")
        fn = t["function"]
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidParameterError("a function needs a non-empty string name", f"tools[{i}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InvalidParameterError("parameters must be a JSON schema object", f"tools[{i}].function.parameters")
        functions.append({k: fn[k] for k in ("name", "description", "parameters") if fn.get(k) is not None})
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        return ToolPlan(tool_choice or "auto", functions)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if not any(f["name"] == name for f in functions):
            raise InvalidParameterError(f"tool_choice names function {name!r}, which is not in tools",
                                        "tool_choice.function.name")
        return ToolPlan("named", functions, name)
    raise InvalidParameterError("tool_choice must be 'none', 'auto', 'required' or "
                                "{'type': 'function', 'function': {'name': ...}}", "tool_choice")


def tools_system_prompt(functions: list[dict[str, Any]]) -> str:
    listed = "\n".join(json.dumps({"type": "function", "function": f}, ensure_ascii=False) for f in functions)
    return ("You are a function calling AI model. You may call one or more functions to assist with the user query. "
            f"The functions are given in <tools></tools>:\n<tools>\n{listed}\n</tools>\n"
            "For each function call, return a JSON object with the function name and arguments within "
            '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
            "\n</tool_call>")


def prepare_messages(messages: list[dict[str, Any]], plan: ToolPlan | None,
                     template_renders_tools: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, template kwargs) for the chat template: tools passed to a template that renders them, else
    described in the system message; earlier assistant tool calls written back in the model's format."""
    extra: dict[str, Any] = {}
    if plan is not None and plan.choice != "none" and template_renders_tools:
        extra["tools"] = [{"type": "function", "function": f} for f in plan.functions]
    if template_renders_tools:
        return messages, extra
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            written = "".join(f'{OPEN}{{"name": {json.dumps(c["function"]["name"])}, "arguments": '
                              f'{c["function"]["arguments"]}}}{CLOSE}' for c in m["tool_calls"])
            m = {**m, "content": (m.get("content") or "") + written}
        out.append(m)
    if plan is not None and plan.choice != "none":
        prompt = tools_system_prompt(plan.functions)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, extra


@dataclass(slots=True)
class ToolCallStreamer:
    """Turns one choice's text deltas into chat deltas: content, or ``tool_calls`` fragments.

    Named function: the call's header first, then the argument text as it comes. ``required``: the call whole at
    the end (its name is known only then). ``auto``: text that starts (after whitespace) with ``<tool_call>`` is
    held and parsed at the end; anything else streams as content."""

    plan: ToolPlan
    text: str = ""
    held: bool = True
    header_sent: bool = False
    called: bool = False
    _id: str = field(default_factory=new_call_id)

    def feed(self, delta: str, finished: bool) -> list[dict[str, Any]]:
        self.text += delta
        choice = self.plan.choice
        if choice == "named":
            out = []
            if not self.header_sent:
                self.header_sent = self.called = True
                out.append({"tool_calls": [{"index": 0, "id": self._id, "type": "function",
                                            "function": {"name": self.plan.named, "arguments": ""}}]})
            if delta:
                out.append({"tool_calls": [{"index": 0, "function": {"arguments": delta}}]})
            return out
        if choice == "auto" and self.held:
            lead = self.text.lstrip()
            if not (lead.startswith(OPEN) or OPEN.startswith(lead)):  # not a tool call: stream as content
                self.held = False
                return [{"content": self.text}] if self.text else []
        elif choice not in ("auto", "required"):
            return [{"content": delta}] if delta else []
        if not self.held:
            return [{"content": delta}] if delta else []
        if not finished:
            return []
        content, calls = self.plan.parse(self.text)
        out = [{"content": content}] if content else []
        if calls:
            self.called = True
            out.append({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
        return out
