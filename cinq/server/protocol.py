"""OpenAI request schemas (pydantic) for the routes cinq serves, with the vLLM extras that tools rely on.

Types are strict (``"5"`` is not an integer, ``true`` is not a number) so that a wrong type is reported as the
field it is in; value ranges are checked once, by ``SamplingParams``, so the server and the offline API agree.
Fields that OpenAI defines and cinq cannot honour are rejected by name rather than silently ignored; unknown
fields are ignored, as OpenAI does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cinq.errors import InvalidParameterError
from cinq.sampling_params import MAX_LOGPROBS, OutputKind, SamplingParams

_STRICT = ConfigDict(strict=True, extra="ignore")


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = _STRICT
    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None

    def _check_common(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise InvalidParameterError("stream_options is only allowed when stream is true", "stream_options")
        if self.logit_bias:
            raise InvalidParameterError("logit_bias is not supported by cinq", "logit_bias")
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidParameterError(f"best_of ({self.best_of}) other than n ({self.n}) is not supported",
                                        "best_of")

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None
                         ) -> SamplingParams:
        given = {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
        }
        return SamplingParams(
            n=self.n, seed=self.seed, max_tokens=max_tokens, min_tokens=self.min_tokens, stop=self.stop,
            stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            output_kind=OutputKind.DELTA if self.stream else OutputKind.FINAL_ONLY,
            **{k: v for k, v in given.items() if v is not None})

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def to_sampling_params(self) -> SamplingParams:
        self._check_common()
        if self.suffix:
            raise InvalidParameterError("suffix is not supported by cinq", "suffix")
        prompt_logprobs = self.logprobs if self.echo and self.logprobs is not None else None
        return self._sampling_params(self.max_tokens, self.logprobs, prompt_logprobs)

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (strings or token-id lists)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidParameterError("prompt must not be empty", "prompt")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # name, tool_call_id... reach the template as given
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None

    def to_template(self, index: int) -> dict[str, Any]:
        """The message as the chat template sees it: content parts of type text joined into one string."""
        msg = self.model_dump(exclude_none=True)
        content = self.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise InvalidParameterError(
                        f"messages[{index}].content[{j}]: content parts of type {part.type!r} are not supported "
                        f"(only 'text')", "messages")
                texts.append(part.text)
            msg["content"] = "".join(texts)
        elif content is None:
            msg["content"] = ""
        return msg


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str = "text"


class ChatCompletionRequest(_SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None

    def to_sampling_params(self) -> SamplingParams:
        self._check_common()
        if not self.messages:
            raise InvalidParameterError("messages must hold at least one message", "messages")
        if self.response_format is not None and self.response_format.type != "text":
            raise InvalidParameterError(
                f"response_format type {self.response_format.type!r} is not supported (only 'text')",
                "response_format")
        if self.tools and self.tool_choice not in (None, "none"):
            raise InvalidParameterError("tool calling is not supported by cinq; send tool_choice 'none' or no "
                                        "tools", "tools")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParameterError("top_logprobs requires logprobs to be true", "top_logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise InvalidParameterError(
                f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}", "top_logprobs")
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling_params(max_tokens, logprobs, None)

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.to_template(i) for i, m in enumerate(self.messages)]


class TokenizeRequest(BaseModel):
    """POST /tokenize: either ``prompt`` or ``messages`` (rendered with the chat template)."""

    model_config = _STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    """POST /detokenize."""

    model_config = _STRICT
    model: str | None = None
    tokens: list[int] = Field(default_factory=list)
