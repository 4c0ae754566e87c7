"""OpenAI request schemas (pydantic) for the routes cinq serves, with the vLLM extras that tools rely on.

Types are strict (``"5"`` is not an integer, ``true`` is not a number) so that a wrong type is reported as the
field it is in; value ranges are checked once, by ``SamplingParams``, so the server and the offline API agree,
and are *stated* here (``_schema``) for the OpenAPI document (server/openapi.py). Fields that OpenAI defines and
cinq cannot honour are rejected by name rather than silently ignored; unknown top-level fields are ignored, as
OpenAI does; chat messages (server/messages.py) allow exactly their role's keys, as OpenAI does. vLLM's extra
fields that cinq does not implement (beam search, allowed / bad words, prompt truncation ...) are accepted only at a
value that asks for nothing (null, false, [] or their default) and otherwise rejected by name, as ``logit_bias`` is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from cinq.engine.beam_search import MAX_BEAM_WIDTH, BeamSearchParams
from cinq.engine.spec_metrics import MAX_LANGUAGE_LEN, check_language
from cinq.errors import CinqError, InvalidParameterError
from cinq.model.generation_defaults import fill_defaults
from cinq.sampling_params import MAX_BAD_WORDS, MAX_LOGPROBS, OutputKind, SamplingParams
from cinq.model.chat_template import generation_flags
from cinq.server.messages import ChatMessage, template_messages
from cinq.server.structured import GUIDED, constraint_from_fields, constraint_from_response_format
from cinq.server.tools import ToolPlan, tool_plan
from cinq.structured.manager import DEFAULT_BACKEND
from cinq.structured.params import StructuredOutputsParams

_STRICT = ConfigDict(strict=True, extra="ignore")
# Markers the OpenAPI builder (server/openapi.py) replaces with this server's limits, known when the app is built.
TOKEN_ID_MARK, MAX_TOKENS_MARK, TEXT_PROMPT_MARK = "x-cinq-token-id", "x-cinq-max-tokens", "x-cinq-text-prompt"
CONTEXT_MARK = "x-cinq-context"  # at most max_model_len
TOKEN_ID_KEY_MARK = "x-cinq-token-id-key"  # a decimal token id, no more digits than the largest
TOKEN_ID_KEY = re.compile(r"0|[1-9][0-9]{0,8}")  # what the schema's pattern also requires (no leading zeros)


def _schema(default: Any = None, **constraints: Any) -> Any:
    """A field whose range is *documented* in the schema but checked by ``SamplingParams`` (one check, one
    message, shared with the offline API); tests/server/test_openapi.py holds the two to the same bounds."""
    return Field(default, json_schema_extra=constraints)


def _unsupported(*allowed: Any, **constraints: Any) -> Any:
    """A vLLM field cinq does not implement: only ``allowed`` values (or what ``constraints`` such as
    ``maxItems=0`` let through) ask for nothing; ``_check_unsupported`` rejects the others by name."""
    if allowed:
        constraints["enum"] = list(allowed)
    return _schema(None, description="not supported by cinq: omit it (null, false, [] and the default are "
                                     "accepted)", **constraints)


# The vLLM fields _check_unsupported refuses when they ask for something
_UNSUPPORTED_COMMON = ("guided_whitespace_pattern",)
# What a use_beam_search request may give besides its prompt (engine/beam_search.py uses nothing else)
_BEAM_FIELDS = {"model", "prompt", "messages", "n", "max_tokens", "max_completion_tokens", "temperature", "ignore_eos",
                "length_penalty", "use_beam_search", "user", "language", "add_generation_prompt",
                "continue_final_message", "chat_template_kwargs", "truncate_prompt_tokens", "skip_special_tokens",
                "stream", "best_of"}


def rename_max_tokens(error: CinqError, field: str) -> CinqError:
    """``error`` naming ``field`` (``max_completion_tokens``) where it says ``max_tokens``, when that field carried
    the value (SamplingParams and the engine know only ``max_tokens``)."""
    if field == "max_tokens" or error.param not in ("max_tokens", "min_tokens"):
        return error
    message = re.sub(r"\bmax_tokens\b", field, str(error))
    return type(error)(message, field if error.param == "max_tokens" else error.param)


TokenId = Annotated[int, Field(json_schema_extra={"minimum": 0, TOKEN_ID_MARK: True})]
TokenIds = Annotated[list[TokenId], Field(json_schema_extra={"minItems": 1})]
NonEmptyStr = Annotated[str, Field(json_schema_extra={"minLength": 1})]
TextPrompt = Annotated[str, Field(json_schema_extra={TEXT_PROMPT_MARK: True})]  # minLength 1 unless BOS is added
_STREAM_ONLY = {"if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
                "then": {"required": ["stream"], "properties": {"stream": {"const": True}}}}
# An explicit add_generation_prompt: true clashes with continue_final_message, as in vLLM
_CONTINUE = {"if": {"required": ["continue_final_message"], "properties": {"continue_final_message": {"const": True}}},
             "then": {"properties": {"add_generation_prompt": {"const": False}}}}

_CONSTRAINT_FIELDS = ("structured_outputs", *GUIDED)
_GIVEN = {"not": {"type": "null"}}  # null counts as absent


def _at_most_one_constraint() -> list[dict]:
    """At most one of the vLLM constraint fields given non-null (constraint_from_fields checks the same). Written
    as if/then (once one is given, the others are null), which schemathesis generates from; ``not: anyOf`` of the
    pairs it could not."""
    return [{"if": {"required": [a], "properties": {a: _GIVEN}},
             "then": {"properties": {b: {"type": "null"} for b in _CONSTRAINT_FIELDS if b != a}}}
            for a in _CONSTRAINT_FIELDS]


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = _STRICT
    model: str | None = None
    n: int = _schema(1, minimum=1, maximum=128)
    temperature: float | None = _schema(minimum=0, maximum=100)
    top_p: float | None = _schema(exclusiveMinimum=0, maximum=1)
    top_k: int | None = _schema(minimum=-1, maximum=1 << 30)
    min_p: float | None = _schema(minimum=0, maximum=1)
    presence_penalty: float | None = _schema(minimum=-2, maximum=2)
    frequency_penalty: float | None = _schema(minimum=-2, maximum=2)
    repetition_penalty: float | None = _schema(exclusiveMinimum=0, maximum=100)
    seed: int | None = _schema(minimum=-(1 << 63), maximum=(1 << 63) - 1)
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(json_schema_extra={"maxItems": 16})] | None = None
    stop_token_ids: list[TokenId] | None = None
    allowed_token_ids: Annotated[list[TokenId], Field(json_schema_extra={"minItems": 1})] | None = _schema(
        description="the only tokens that may be sampled")
    bad_words: Annotated[list[Annotated[str, Field(json_schema_extra={"pattern": r"\S"})]],
                         Field(json_schema_extra={"maxItems": MAX_BAD_WORDS})] | None = _schema(
        description="words never to generate (each is banned wherever the output spells it)")
    ignore_eos: bool = False
    min_tokens: int = _schema(0, minimum=0, maximum=1 << 24, description="at most max_tokens")
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = _schema(minimum=0, maximum=MAX_LOGPROBS,
                                          description="the top k logprobs of every prompt token (not with stream: "
                                                      "true; schemathesis cannot generate from one more if/then)")
    return_tokens_as_token_ids: bool | None = _schema(description="name logprobs' tokens 'token_id:<id>'")
    truncate_prompt_tokens: int | None = _schema(minimum=-1, **{CONTEXT_MARK: True},
                                                 description="keep only the prompt's last k tokens (-1: the context "
                                                             "length; 0 is refused), at most max_model_len")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: Annotated[dict[str, float], Field(json_schema_extra={
        "propertyNames": {TOKEN_ID_KEY_MARK: True},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}})] | None = _schema(
        description="token id (a decimal string, below the vocabulary size) -> bias added to its logit, -100..100")
    best_of: int | None = _schema(description="not supported other than equal to n")
    # cinq's extra: labels this request's speculative-decoding counters in /metrics and /stats
    language: str | None = _schema(minLength=1, maxLength=MAX_LANGUAGE_LEN, pattern="^[A-Za-z0-9_-]+$",
                                   description="a tag (e.g. 'de', 'python') labelling this request's "
                                               "speculative-decoding acceptance metrics")
    # vLLM's extra body fields for constrained decoding (cinq/structured/); at most one of them
    structured_outputs: dict[str, Any] | None = _schema(description="one of json, regex, choice, grammar, "
                                                                    "json_object (vLLM's StructuredOutputsParams)")
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = _schema(enum=[DEFAULT_BACKEND, "auto", None],
                                                  description=f"cinq compiles every constraint with {DEFAULT_BACKEND}")
    # vLLM's extras that cinq does not implement (_check_unsupported)
    use_beam_search: bool | None = _schema(description="beam search (n beams, each a choice) in place of sampling")
    length_penalty: float | None = _schema(minimum=-10, maximum=10, description="beam search: scores are "
                                           "cum_logprob / generated_len ** length_penalty")
    guided_whitespace_pattern: str | None = _unsupported(None)
    # set by to_sampling_params: the field the constraint came from (compile errors name it), the tool plan
    _constraint_field: str | None = PrivateAttr(None)
    _tool_plan: ToolPlan | None = PrivateAttr(None)

    def _constraint(self) -> tuple[StructuredOutputsParams | None, str | None]:
        return constraint_from_fields({name: getattr(self, name) for name in (
            "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")})

    def _check_common(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise InvalidParameterError("stream_options is only allowed when stream is true", "stream_options")
        if self.prompt_logprobs is not None and self.stream:  # as vLLM: they would come before any token
            raise InvalidParameterError("prompt_logprobs is not available with stream: true", "prompt_logprobs")
        bad_key = next((k for k in self.logit_bias or () if not TOKEN_ID_KEY.fullmatch(k)), None)
        if bad_key is not None:
            raise InvalidParameterError(f"logit_bias keys must be token ids (decimal strings without leading zeros), "
                                        f"got {bad_key!r:.40}", "logit_bias")
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidParameterError(f"best_of ({self.best_of}) other than n ({self.n}) is not supported",
                                        "best_of")
        check_language(self.language)
        self._check_unsupported(_UNSUPPORTED_COMMON)
        if self.use_beam_search:
            self._check_beam_search()
        elif self.length_penalty not in (None, 1):
            raise InvalidParameterError("length_penalty applies to beam search only (use_beam_search: true)",
                                        "length_penalty")
        if self.guided_decoding_backend not in (None, "auto", DEFAULT_BACKEND):
            raise InvalidParameterError(
                f"guided_decoding_backend {self.guided_decoding_backend!r}: this server compiles every constraint "
                f"with {DEFAULT_BACKEND!r} (no per-request backend)", "guided_decoding_backend")

    def _check_beam_search(self) -> None:
        """A beam search request gives no field that beam search would ignore, and no more beams than it keeps."""
        for name in sorted(self.model_fields_set - _BEAM_FIELDS):
            value = getattr(self, name)
            if value is not None and value is not False and value != [] and value != {}:
                raise InvalidParameterError(f"{name} is not used by beam search (use_beam_search: true); omit it", name)
        if self.stream:
            raise InvalidParameterError("use_beam_search does not stream: give stream false", "stream")
        if self.n > MAX_BEAM_WIDTH:
            raise InvalidParameterError(f"n (the beam width under use_beam_search) must be <= {MAX_BEAM_WIDTH}, got "
                                        f"{self.n}", "n")

    def beam_search_params(self, max_tokens: int) -> BeamSearchParams:
        """The request as ``BeamSearchParams`` (``n`` beams); ``max_tokens``: resolved against the prompt."""
        return BeamSearchParams(self.n, max_tokens, self.ignore_eos, self.temperature or 0.0,
                                1.0 if self.length_penalty is None else self.length_penalty)

    def _check_unsupported(self, names: tuple[str, ...]) -> None:
        for name in names:
            value = getattr(self, name)
            if value is None or value is False or value == []:
                continue
            raise InvalidParameterError(f"{name} is not supported by cinq (got {value!r:.60}); omit it", name)

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None,
                         defaults: Mapping[str, Any] | None,
                         structured: StructuredOutputsParams | None = None) -> SamplingParams:
        """``max_tokens``: already resolved (None: up to the context). The sampling fields the request omits
        come from ``defaults`` (the model's generation config, as vLLM fills them), then SamplingParams'."""
        given = {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty, "max_tokens": max_tokens,
            "min_tokens": self.min_tokens if "min_tokens" in self.model_fields_set else None,
        }
        values = fill_defaults(given, {k: v for k, v in (defaults or {}).items() if k != "max_tokens"})
        values["max_tokens"] = max_tokens
        return SamplingParams(
            n=self.n, seed=self.seed, stop=self.stop,
            stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            logit_bias=None if self.logit_bias is None else {int(t): b for t, b in self.logit_bias.items()},
            allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
            output_kind=OutputKind.DELTA if self.stream else OutputKind.FINAL_ONLY, structured_outputs=structured,
            **values)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions."""

    model_config = ConfigDict(strict=True, extra="ignore", json_schema_extra={"allOf": [
        _STREAM_ONLY, *_at_most_one_constraint(), {
        "if": {"required": ["max_tokens"], "properties": {"max_tokens": {"const": 0}}},
        "then": {"required": ["echo"], "properties": {"echo": {"const": True}}}}]})
    prompt: (TextPrompt | Annotated[list[TextPrompt], Field(json_schema_extra={"minItems": 1})] | TokenIds
             | Annotated[list[TokenIds], Field(json_schema_extra={"minItems": 1})])
    max_tokens: int | None = _schema(16, minimum=0, description="0 only with echo: score the prompt",
                                     **{MAX_TOKENS_MARK: True})
    logprobs: int | None = _schema(minimum=0, maximum=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = _schema(maxLength=0, description="not supported: omit, null or ''")

    def to_sampling_params(self, defaults: Mapping[str, Any] | None = None) -> SamplingParams:
        """The request as SamplingParams; ``defaults``: the model's sampling defaults for omitted fields."""
        self._check_common()
        if self.suffix:
            raise InvalidParameterError("suffix is not supported by cinq", "suffix")
        if self.max_tokens == 0 and not self.echo:
            raise InvalidParameterError("max_tokens must be at least 1, got 0 (0 is for scoring the prompt: only "
                                        "with echo true)", "max_tokens")
        asked = [k for k in (self.logprobs if self.echo else None, self.prompt_logprobs) if k is not None]
        prompt_logprobs = max(asked) if asked else None  # each use keeps its own top k
        # omitted: the model's max_new_tokens, else OpenAI's 16; an explicit null: up to the context
        max_tokens = self.max_tokens if "max_tokens" in self.model_fields_set \
            else (defaults or {}).get("max_tokens", self.max_tokens)
        structured, self._constraint_field = self._constraint()
        return self._sampling_params(max_tokens, self.logprobs, prompt_logprobs, defaults, structured)

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (strings or token-id lists)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p or any(isinstance(q, list) and not q for q in p):
            raise InvalidParameterError("prompt must not be empty (nor hold an empty token list)", "prompt")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class JSONSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's named schema (``schema`` is the JSON schema itself)."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str = _schema("text", enum=["text", "json_object", "json_schema"])
    json_schema: JSONSchemaFormat | None = None


class ChatCompletionRequest(_SamplingRequest):
    """POST /v1/chat/completions."""

    # No _at_most_one_constraint here: with it schemathesis cannot generate this schema at all ("Schema Error")
    model_config = ConfigDict(strict=True, extra="ignore", json_schema_extra={"allOf": [_STREAM_ONLY, _CONTINUE, {
        "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}]})
    messages: Annotated[list[ChatMessage], Field(json_schema_extra={"minItems": 1})]
    max_tokens: int | None = _schema(minimum=1, **{MAX_TOKENS_MARK: True})
    max_completion_tokens: int | None = _schema(minimum=1, **{MAX_TOKENS_MARK: True})
    logprobs: bool = False
    top_logprobs: int | None = _schema(minimum=0, maximum=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    continue_final_message: bool = _schema(False, description="leave the final (assistant) message open for the "
                                                              "model to continue; add_generation_prompt must not "
                                                              "be true as well")
    echo: bool | None = _schema(description="prepend the final message's content to the reply when it is the "
                                            "assistant's (vLLM's; with continue_final_message, the whole message)")
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None

    def to_sampling_params(self, defaults: Mapping[str, Any] | None = None) -> SamplingParams:
        """The request as SamplingParams; ``defaults``: the model's sampling defaults for omitted fields."""
        self._check_common()
        if not self.messages:
            raise InvalidParameterError("messages must hold at least one message", "messages")
        structured = self._structured_constraint()
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParameterError("top_logprobs requires logprobs to be true", "top_logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise InvalidParameterError(
                f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}", "top_logprobs")
        field = self.max_tokens_field
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if max_tokens is not None and max_tokens < 1:  # OpenAI's and vLLM's floor: a reply of nothing is no reply
            raise InvalidParameterError(f"{field} must be at least 1, got {max_tokens}", field)
        if max_tokens is None:  # neither given: the model's max_new_tokens, else up to the context
            max_tokens = (defaults or {}).get("max_tokens")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        try:
            return self._sampling_params(max_tokens, logprobs, self.prompt_logprobs, defaults, structured)
        except CinqError as e:
            raise rename_max_tokens(e, field) from None

    @property
    def max_tokens_field(self) -> str:
        """The field the completion's length came from, for errors about it."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def generation_prompt(self) -> bool:
        """``add_generation_prompt`` to render with, ``continue_final_message`` checked (server/chat_prompt.py)."""
        return generation_flags(self.messages, self.add_generation_prompt,
                                "add_generation_prompt" in self.model_fields_set, self.continue_final_message)

    def _structured_constraint(self) -> StructuredOutputsParams | None:
        """One constraint from response_format, the vLLM fields or a required / named tool choice (the field it
        came from in ``_constraint_field``, to name it in compile errors)."""
        self._tool_plan = tool_plan(self.tools, self.tool_choice)
        sources: list[tuple[StructuredOutputsParams, str]] = []
        fmt = constraint_from_response_format(self.response_format)
        if fmt is not None:
            sources.append((fmt, "response_format.json_schema.schema" if fmt.json is not None else "response_format"))
        fields, field = self._constraint()
        if fields is not None:
            sources.append((fields, field or "structured_outputs"))
        tool = self._tool_plan.constraint() if self._tool_plan is not None else None
        if tool is not None:
            sources.append((tool, "tools"))
        if len(sources) > 1:
            raise InvalidParameterError(f"{sources[0][1]} and {sources[1][1]} both constrain the output: give one",
                                        sources[1][1])
        self._constraint_field = sources[0][1] if sources else None
        return sources[0][0] if sources else None

    @property
    def echoed(self) -> str:
        """What ``echo`` prepends to each choice's content: the final message's text when it is the assistant's."""
        if not self.echo or not self.messages:
            return ""
        final = self.template_messages()[-1]
        return final["content"] if final.get("role") == "assistant" else ""

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)


class TokenizeRequest(BaseModel):
    """POST /tokenize: either ``prompt`` or ``messages`` (rendered with the chat template)."""

    model_config = ConfigDict(strict=True, extra="ignore", json_schema_extra={"allOf": [_CONTINUE], "oneOf": [
        {"required": [given], "properties": {given: {"type": kind}},
         "not": {"required": [other], "properties": {other: {"type": other_kind}}}}  # null counts as absent
        for given, kind, other, other_kind in (("prompt", "string", "messages", "array"),
                                               ("messages", "array", "prompt", "string"))]})
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(json_schema_extra={"minItems": 1})] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    def generation_prompt(self) -> bool:
        """``add_generation_prompt`` to render ``messages`` with, ``continue_final_message`` checked."""
        return generation_flags(self.messages or [], self.add_generation_prompt,
                                "add_generation_prompt" in self.model_fields_set, self.continue_final_message)


class DetokenizeRequest(BaseModel):
    """POST /detokenize."""

    model_config = _STRICT
    model: str | None = None
    tokens: list[TokenId] = Field(default_factory=list)
