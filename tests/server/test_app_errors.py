"""Bad requests: each gets the right 4xx with an OpenAI-shaped body naming the field, and the server keeps
serving everyone else."""

from __future__ import annotations

import httpx
import pytest

from tests.server.harness import MODEL_NAME

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]

# (route, body (dict, or raw bytes), status, param, words the message must contain)
CASES = [
    (CMPL, b'{"prompt": "x", "max_tokens": ', 400, None, ["Invalid JSON"]),
    (CMPL, b'\xff\xfe not utf-8', 400, None, ["Invalid JSON"]),
    (CMPL, b"[" * 100_000 + b"]" * 100_000, 400, None, []),
    (CMPL, b'["a list"]', 400, None, ["JSON object"]),
    (CMPL, {"max_tokens": 3}, 400, "prompt", ["prompt", "required"]),
    (CMPL, {"prompt": None}, 400, "prompt", []),
    (CMPL, {"prompt": "x", "max_tokens": "7"}, 400, "max_tokens", ["integer"]),
    (CMPL, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens", ["max_tokens"]),
    (CMPL, {"prompt": "x", "max_tokens": 2.5}, 400, "max_tokens", ["integer"]),
    (CMPL, {"prompt": "x", "temperature": -0.5}, 400, "temperature", ["temperature"]),
    (CMPL, {"prompt": "x", "temperature": True}, 400, "temperature", ["number"]),
    (CMPL, {"prompt": "x", "top_p": 0}, 400, "top_p", ["top_p"]),
    (CMPL, {"prompt": "x", "min_p": 1.5}, 400, "min_p", ["min_p"]),
    (CMPL, {"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty", ["presence_penalty"]),
    (CMPL, {"prompt": "x", "frequency_penalty": -2.5}, 400, "frequency_penalty", ["frequency_penalty"]),
    (CMPL, {"prompt": "x", "seed": "abc"}, 400, "seed", ["integer"]),
    (CMPL, {"prompt": "x", "n": 0}, 400, "n", ["n must be"]),
    (CMPL, {"prompt": "x", "n": 1000}, 400, "n", ["n must be", "128"]),
    (CMPL, {"prompt": "x", "logprobs": 21}, 400, "logprobs", ["logprobs", "20"]),
    (CMPL, {"prompt": "x", "stop": [""]}, 400, "stop", ["stop"]),
    (CMPL, {"prompt": "x", "stop": [str(i) for i in range(17)]}, 400, "stop", ["16"]),
    (CMPL, {"prompt": "x", "stop_token_ids": [-1]}, 400, "stop_token_ids", ["stop_token_ids"]),
    (CMPL, {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", ["stream"]),
    (CMPL, {"prompt": "x", "logit_bias": {"five": 1.0}}, 400, "logit_bias", ["token ids", "five"]),
    (CMPL, {"prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias", ["[-100, 100]"]),
    (CMPL, {"prompt": "x", "logit_bias": {"99999": 1}}, 400, "logit_bias", ["99999", "range"]),
    (CMPL, {"prompt": "x", "allowed_token_ids": []}, 400, "allowed_token_ids", ["at least one"]),
    (CMPL, {"prompt": "x", "allowed_token_ids": [99999]}, 400, "allowed_token_ids", ["99999"]),
    (CMPL, {"prompt": "x", "suffix": "y"}, 400, "suffix", ["not supported"]),
    (CMPL, {"prompt": []}, 400, "prompt", ["empty"]),
    (CMPL, {"prompt": [[]]}, 400, "prompt", ["empty"]),
    (CMPL, {"prompt": [1, 99999]}, 400, "prompt", ["99999", "range"]),
    (CMPL, {"prompt": [1, -3]}, 400, "prompt", ["-3"]),
    (CMPL, {"prompt": [1, "a"]}, 400, "prompt", []),
    (CMPL, {"prompt": "x" * 700}, 400, "prompt", ["512", "701"]),
    (CMPL, {"prompt": "x" * 400, "max_tokens": 200}, 400, "max_tokens", ["512", "401", "200"]),
    (CMPL, {"prompt": "x" * 700, "stream": True}, 400, "prompt", ["512", "701"]),
    (CMPL, {"prompt": "x", "model": "gpt-4"}, 404, "model", ["gpt-4"]),
    (CHAT, {"messages": []}, 400, "messages", ["at least one"]),
    (CHAT, {}, 400, "messages", ["required"]),
    (CHAT, {"messages": "hi"}, 400, "messages", []),
    (CHAT, {"messages": [{"role": "alien", "content": "x"}]}, 400, "messages", ["role"]),
    (CHAT, {"messages": [{"content": "x"}]}, 400, "messages", ["messages[0].role: field required"]),
    (CHAT, {"messages": [USER[0], {"role": None, "content": "x"}]}, 400, "messages", ["messages[1].role", "None"]),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages", ["content"]),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages", ["image_url"]),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs", ["logprobs"]),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 25}, 400, "top_logprobs", ["20"]),
    (CHAT, {"messages": USER, "logprobs": 3}, 400, "logprobs", ["bool"]),
    (CHAT, {"messages": USER, "max_completion_tokens": 10_000}, 400, "max_completion_tokens",
     ["512", "or max_completion_tokens"]),
    (CHAT, {"messages": USER, "max_completion_tokens": -5}, 400, "max_completion_tokens",
     ["max_completion_tokens must be at least 1, got -5"]),
    (CHAT, {"messages": USER, "max_completion_tokens": 1 << 25}, 400, "max_completion_tokens",
     ["max_completion_tokens must be in"]),
    (CHAT, {"messages": USER, "max_completion_tokens": 3, "min_tokens": 5}, 400, "min_tokens",
     ["max_completion_tokens (3)"]),
    (CHAT, {"messages": USER, "max_completion_tokens": 0}, 400, "max_completion_tokens", ["at least 1, got 0"]),
    (CHAT, {"messages": USER, "max_tokens": 0}, 400, "max_tokens", ["max_tokens must be at least 1, got 0"]),
    (CMPL, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", ["at least 1", "echo"]),
    (CMPL, {"prompt": "x", "stop_token_ids": [10**9]}, 400, "stop_token_ids", ["1000000000", "out of range"]),
    (CHAT, {"messages": USER, "stop_token_ids": [2, 10**9]}, 400, "stop_token_ids", ["1000000000", "range"]),
    (CHAT, {"messages": USER, "response_format": {"type": "json_schema"}}, 400, "response_format.json_schema.schema",
     ["schema"]),
    (CHAT, {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}}, 400, "response_format.json_schema.schema", ["nonsense"]),
    (CHAT, {"messages": USER, "response_format": {"type": "xml"}}, 400, "response_format.type", ["xml"]),
    (CHAT, {"messages": USER, "tools": [{"type": "function"}], "tool_choice": "auto"}, 400, "tools[0]", ["function"]),
    (CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice.function.name", ["'g'"]),
    (CHAT, {"messages": USER, "guided_regex": "(unclosed"}, 400, "guided_regex", ["guided_regex"]),
    (CHAT, {"messages": USER, "guided_choice": []}, 400, "guided_choice", ["list"]),
    (CHAT, {"messages": USER, "guided_json": {"type": "object"}, "guided_regex": "a"}, 400, "guided_regex", ["one"]),
    (CMPL, {"prompt": "a", "structured_outputs": {"grammar": "root ::= ("}}, 400,
     "structured_outputs.grammar", ["grammar"]),
    (CMPL, {"prompt": "a", "structured_outputs": {"jsn": {}}}, 400, "structured_outputs.jsn",
     ["unknown"]),
    (CHAT, {"messages": USER, "model": "nope"}, 404, "model", ["nope"]),
    (CHAT, {"messages": USER, "n": 129, "stream": True}, 400, "n", ["128"]),
    ("/tokenize", {"prompt": "a", "messages": USER}, 400, "prompt", ["exactly one"]),
    ("/detokenize", {"tokens": [1, 10**6]}, 400, "tokens", ["range"]),
]


def _post(url: str, body) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    return httpx.post(url, json=body, timeout=30)


def _check_shape(resp: httpx.Response) -> dict:
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


@pytest.mark.parametrize("route,body,status,param,words", CASES,
                         ids=[f"{i}-{c[0].strip('/').replace('/', '_')}" for i, c in enumerate(CASES)])
def test_bad_request(server, route, body, status, param, words):
    resp = _post(server.url + route, body)
    assert resp.status_code == status, resp.text
    err = _check_shape(resp)
    assert err["param"] == param, err
    for word in words:
        assert word.lower() in err["message"].lower(), err


def test_unknown_route_and_method_are_openai_shaped(server):
    r = httpx.get(server.url + "/v1/nothing-here")
    assert r.status_code == 404
    _check_shape(r)
    r = httpx.get(server.url + "/v1/completions")
    assert r.status_code == 405
    _check_shape(r)


def test_server_keeps_serving_after_bad_requests(server):
    for route, body, *_ in CASES[::3]:
        _post(server.url + route, body)
    assert httpx.get(server.url + "/health").status_code == 200
    ok = httpx.post(server.url + CMPL, json={"model": MODEL_NAME, "prompt": "still alive", "max_tokens": 4,
                                            "ignore_eos": True}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
    assert server.stats()["step_failures"] == 0
    server.wait_idle()
