"""Chat messages as the OpenAI API defines them: one model per role, with exactly the keys that role may carry.

A message that carries no content where its role needs one (``system``, ``developer``, ``user``, ``tool``,
``function``), a ``tool`` message without ``tool_call_id``, an ``assistant`` message with neither ``content`` nor
``tool_calls``, or any key the role does not define is a 400 naming it (``messages[1].tool_call_id``), as OpenAI
answers; before, such messages reached the chat template and generated from a silently empty turn.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from cinq.errors import InvalidParameterError

_FORBID = ConfigDict(strict=True, extra="forbid")
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class TextPart(BaseModel):
    """A content part; cinq's models read text only, so ``text`` is the one part type accepted."""

    model_config = _FORBID
    type: Literal["text"]
    text: str


Content = Union[str, Annotated[list[TextPart], Field(min_length=1)]]


class _Message(BaseModel):
    model_config = _FORBID

    def to_template(self) -> dict[str, Any]:
        """The message as the chat template sees it: text parts joined into one string, absent content ''."""
        msg = self.model_dump(exclude_none=True)
        content = getattr(self, "content", None)
        msg["content"] = "".join(p.text for p in content) if isinstance(content, list) else (content or "")
        return msg


class SystemMessage(_Message):
    role: Literal["system"]
    content: Content
    name: str | None = None


class DeveloperMessage(_Message):
    role: Literal["developer"]
    content: Content
    name: str | None = None


class UserMessage(_Message):
    role: Literal["user"]
    content: Content
    name: str | None = None


class FunctionCall(BaseModel):
    model_config = _FORBID
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = _FORBID
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Message):
    """A turn of history; ``content`` may be absent only when the turn called tools."""

    model_config = ConfigDict(strict=True, extra="forbid", json_schema_extra={
        "anyOf": [{"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
                  {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array"}}},
                  {"required": ["function_call"], "properties": {"function_call": {"type": "object"}}}]})
    role: Literal["assistant"]
    content: Content | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = None
    function_call: FunctionCall | None = None

    @model_validator(mode="after")
    def _needs_content_or_tool_calls(self) -> AssistantMessage:
        if self.content is None and self.tool_calls is None and self.function_call is None:
            raise ValueError("an assistant message needs content or tool_calls")
        return self


class ToolMessage(_Message):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


class FunctionMessage(_Message):
    """The deprecated predecessor of ``tool`` messages (content may be null, name is required)."""

    role: Literal["function"]
    content: str | None
    name: str


def _role_tag(value: Any) -> str | None:
    role = value.get("role") if isinstance(value, dict) else getattr(value, "role", None)
    # The tag is not an identifier so that error paths drop it: messages[0].content, not messages[0].user.content
    return f"role:{role}" if role in ROLES else None


ROLE_ERROR = "invalid_role"  # the error type of a message without a known role (server/errors.py words it)
ChatMessage = Annotated[
    Union[Annotated[SystemMessage, Tag("role:system")], Annotated[DeveloperMessage, Tag("role:developer")],
          Annotated[UserMessage, Tag("role:user")], Annotated[AssistantMessage, Tag("role:assistant")],
          Annotated[ToolMessage, Tag("role:tool")], Annotated[FunctionMessage, Tag("role:function")]],
    Discriminator(_role_tag, custom_error_type=ROLE_ERROR,
                  custom_error_message=f"role must be one of {', '.join(repr(r) for r in ROLES)}")]


def template_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The messages as the chat template sees them; at least one is needed."""
    if not messages:
        raise InvalidParameterError("messages must hold at least one message", "messages")
    return [m.to_template() for m in messages]
