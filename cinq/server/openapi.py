"""The OpenAPI 3.1 document served at ``/openapi.json``, written to tell the truth about this server.

Routes parse their bodies by hand (see app.py), so FastAPI cannot infer the document; it is built here from the
same pydantic request models, with the limits that only the built app knows filled in (token ids below the vocab
size, ``max_tokens`` below the context length), the constraints that ``SamplingParams`` checks (ranges, minimum
lengths, exactly one of ``prompt`` / ``messages``), both content types of the generation routes (JSON, or
``text/event-stream`` with ``stream: true``) and every status a client can get. A client generated from it, or a
fuzzer, then agrees with the server. What no schema can say (a prompt's token count against the context length)
is a documented 400 with code ``context_length_exceeded``, and ``continue_final_message`` with a final message whose
text the chat template does not write out is a 400 the schema cannot state either (it depends on the template).
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from cinq.server.protocol import (CONTEXT_MARK, MAX_TOKENS_MARK, TEXT_PROMPT_MARK, TOKEN_ID_KEY_MARK,
                                  TOKEN_ID_MARK, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                  TokenizeRequest)

_REF = "#/components/schemas/{model}"
_STR, _INT, _NUM = {"type": "string"}, {"type": "integer"}, {"type": "number"}
_NULL = {"type": "null"}


def _obj(required: list[str] | None = None, **props: Any) -> dict:
    """A closed object: every listed property required unless ``required`` says otherwise."""
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, _NULL]}


def _ref(name: str) -> dict:
    return {"$ref": _REF.format(model=name)}


_USAGE = _obj(prompt_tokens=_INT, completion_tokens=_INT, total_tokens=_INT)
_FINISH = {"finish_reason": _nullable(_STR), "stop_reason": {"anyOf": [_STR, _INT, _NULL]}}
_COMPLETION_LOGPROBS = _obj(
    tokens={"type": "array", "items": _STR}, token_logprobs={"type": "array", "items": _nullable(_NUM)},
    top_logprobs={"type": "array", "items": _nullable({"type": "object", "additionalProperties": _NUM})},
    text_offset={"type": "array", "items": _INT})
_TOP = _obj(token=_STR, logprob=_NUM, bytes={"type": "array", "items": _INT})
# vLLM's prompt_logprobs: per prompt token null (the first) or token id -> its logprob, rank and text
_PROMPT_LOGPROBS = {"type": "array", "items": _nullable({"type": "object", "additionalProperties": _obj(
    logprob=_NUM, rank=_nullable(_INT), decoded_token=_STR)})}


def _optional(schema: dict, *names: str) -> dict:
    """``schema`` (an ``_obj``) with ``names`` no longer required."""
    return {**schema, "required": [r for r in schema["required"] if r not in names]}
_CHAT_LOGPROBS = _obj(content={"type": "array", "items": _obj(
    token=_STR, logprob=_NUM, bytes={"type": "array", "items": _INT}, top_logprobs={"type": "array", "items": _TOP})})

RESPONSES: dict[str, dict] = {
    "Error": _obj(error=_obj(message=_STR, type=_STR, param=_nullable(_STR), code=_nullable(_STR))),
    "Usage": _USAGE,
    "Completion": _obj(
        id=_STR, object={"const": "text_completion"}, created=_INT, model=_STR, system_fingerprint=_NULL,
        choices={"type": "array", "items": _optional(_obj(
            index=_INT, text=_STR, logprobs=_nullable(_COMPLETION_LOGPROBS), prompt_logprobs=_PROMPT_LOGPROBS,
            **_FINISH), "prompt_logprobs")},
        usage=_ref("Usage")),
    "ChatCompletion": _optional(_obj(
        id=_STR, object={"const": "chat.completion"}, created=_INT, model=_STR, system_fingerprint=_NULL,
        choices={"type": "array", "items": _obj(
            index=_INT, message=_obj(role={"const": "assistant"}, content=_STR),
            logprobs=_nullable(_CHAT_LOGPROBS), **_FINISH)},
        usage=_ref("Usage"), prompt_logprobs=_PROMPT_LOGPROBS), "prompt_logprobs"),
    "Model": _obj(id=_STR, object={"const": "model"}, created=_INT, owned_by=_STR, root=_STR, parent=_NULL,
                  max_model_len=_INT, permission={"type": "array", "maxItems": 0}),
    "ModelList": _obj(object={"const": "list"}, data={"type": "array", "items": _ref("Model")}),
    "TokenizeResponse": _obj(count=_INT, max_model_len=_INT, tokens={"type": "array", "items": _INT}),
    "DetokenizeResponse": _obj(prompt=_STR),
    "Health": _obj(status={"const": "ok"}),
    "Version": _obj(version=_STR),
    "Stats": {"type": "object", "required": ["model", "num_requests_running", "num_requests_waiting",
                                             "kv_cache_usage", "num_kv_blocks"]},
}

# Before OpenAPI 3.2 (no itemSchema) a text/event-stream schema describes each event, as schemathesis reads it.
_SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"], "properties": {"data": {"type": "string"}},
    "description": "one server-sent event: `data: {chunk JSON}` ... then `data: [DONE]`"}}}
_STATUS_TEXT = {
    400: "invalid request: the error's param names the field (context_length_exceeded: prompt + max_tokens)",
    401: "missing or wrong API key", 404: "model not found", 408: "request not received whole in time",
    413: "request body too large", 500: "the request failed inside the engine",
    503: "overloaded (Retry-After) or engine not running",
}


def _errors(*codes: int) -> dict:
    out = {}
    for code in codes:
        resp: dict = {"description": _STATUS_TEXT[code], "content": {"application/json": {"schema": _ref("Error")}}}
        if code == 503:
            resp["headers"] = {"Retry-After": {"schema": _INT, "required": False}}
        out[str(code)] = resp
    return out


def _json(name: str, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _limits(node: Any, vocab_size: int, max_model_len: int, empty_text_ok: bool) -> None:
    """Replace the protocol's markers with this server's limits, in place."""
    if isinstance(node, dict):
        if node.pop(TOKEN_ID_MARK, False):
            node["maximum"] = vocab_size - 1
        if node.pop(MAX_TOKENS_MARK, False):
            node["maximum"] = max_model_len - 1  # a prompt holds at least one token
        if node.pop(TOKEN_ID_KEY_MARK, False):
            # as many digits as the largest id; the exact bound as a regex (an alternation per digit) made
            # schemathesis' strategies nest deep enough to crash CPython 3.11's ast.parse now and then
            node["pattern"] = f"^(0|[1-9][0-9]{{0,{len(str(vocab_size - 1)) - 1}}})$"
        if node.pop(CONTEXT_MARK, False):
            node["maximum"] = max_model_len
        if node.pop(TEXT_PROMPT_MARK, False) and not empty_text_ok:
            node["minLength"] = 1
        for value in node.values():
            _limits(value, vocab_size, max_model_len, empty_text_ok)
    elif isinstance(node, list):
        for value in node:
            _limits(value, vocab_size, max_model_len, empty_text_ok)


def build_openapi(vocab_size: int, max_model_len: int, auth: bool, metrics_require_key: bool,
                  empty_text_ok: bool = False, version: str = "0") -> dict:
    """The document for a server of this vocab size and context length; ``auth``: an API key is required;
    ``empty_text_ok``: the tokenizer adds a BOS token, so an empty text prompt is still one token."""
    requests = [CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest]
    _, defs = models_json_schema([(m, "validation") for m in requests], ref_template=_REF)
    schemas = {**defs["$defs"], **RESPONSES}
    _limits(schemas, vocab_size, max_model_len, empty_text_ok)

    guarded = _errors(401) if auth else {}
    body_errors = {**_errors(400, 404, 408, 413), **guarded}

    def post(request: str, response: dict, *extra: int, summary: str) -> dict:
        return {"post": {"summary": summary, "requestBody": {
            "required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": response, **body_errors, **_errors(*extra)}}}

    def generation(name: str) -> dict:
        return {"description": "the whole result, or server-sent events with stream: true",
                "content": {"application/json": {"schema": _ref(name)}, **_SSE}}

    def get(response: dict, summary: str, open_route: bool = False, **more: dict) -> dict:
        op = {"summary": summary, "responses": {"200": response, **({} if open_route else guarded), **more}}
        if auth and open_route:
            op["security"] = []
        return {"get": op}

    text = {"description": "OK", "content": {"text/plain": {"schema": _STR}}}
    health = get(_json("Health"), "Liveness", open_route=True, **_errors(503))
    paths = {
        "/v1/completions": post("CompletionRequest", generation("Completion"), 500, 503, summary="Completions"),
        "/v1/chat/completions": post("ChatCompletionRequest", generation("ChatCompletion"), 500, 503,
                                     summary="Chat completions"),
        "/v1/models": get(_json("ModelList"), "The served model"),
        "/v1/models/{model_id}": get(_json("Model"), "One served model, by name", **_errors(404)),
        "/tokenize": post("TokenizeRequest", _json("TokenizeResponse"), summary="Text or chat -> token ids"),
        "/detokenize": post("DetokenizeRequest", _json("DetokenizeResponse"), summary="Token ids -> text"),
        "/health": health,
        "/ping": {"get": health["get"], "post": health["get"]},  # vLLM's (SageMaker's) name for it
        "/version": get(_json("Version"), "cinq's version"),
        "/metrics": get(text, "Prometheus metrics", open_route=not metrics_require_key),
        "/stats": get(_json("Stats"), "Live engine state (JSON)"),
        "/": get({"description": "the playground page", "content": {"text/html": {"schema": _STR}}},
                 "Playground", open_route=True),
    }
    paths["/v1/models/{model_id}"]["get"]["parameters"] = [
        {"name": "model_id", "in": "path", "required": True, "schema": _STR}]
    doc: dict = {"openapi": "3.1.0", "info": {"title": "cinq", "version": version}, "paths": paths,
                 "components": {"schemas": schemas}}
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
