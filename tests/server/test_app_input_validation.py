"""Inputs that are valid JSON but not valid requests: lone UTF-16 surrogates anywhere in a body, and chat messages
that break the OpenAI message rules. Each gets a 4xx naming the field, never a 5xx, and the server goes on."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.harness import MODEL_NAME

CMPL, CHAT, TOK = "/v1/completions", "/v1/chat/completions", "/tokenize"
LONE = "\ud800"  # json.dumps writes it as the escape \ud800: valid JSON, but no UTF-8 string holds it
USER = [{"role": "user", "content": "hi"}]

# (route, body, param, path the message must name)
SURROGATES = [
    (CMPL, {"prompt": "a" + LONE}, "prompt", "prompt"),
    (CMPL, {"prompt": ["fine", LONE]}, "prompt", "prompt[1]"),
    (CMPL, {"prompt": "x", "model": LONE}, "model", "model"),
    (CMPL, {"prompt": "x", "stop": ["ok", "\udfff"]}, "stop", "stop[1]"),
    (CMPL, {"prompt": "x", "user": LONE}, "user", "user"),
    (CHAT, {"messages": [{"role": "user", "content": LONE}]}, "messages", "messages[0].content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]}, "messages",
     "messages[0].content[0].text"),
    (CHAT, {"messages": USER, "model": LONE}, "model", "model"),
    (CHAT, {"messages": USER, "chat_template_kwargs": {"k": LONE}}, "chat_template_kwargs",
     "chat_template_kwargs.k"),
    (CHAT, {"messages": USER, "chat_template_kwargs": {LONE: 1}}, "chat_template_kwargs",
     "chat_template_kwargs"),
    (TOK, {"prompt": LONE}, "prompt", "prompt"),
    (TOK, {"messages": [{"role": "user", "content": "a" + LONE + "b"}]}, "messages", "messages[0].content"),
    (TOK, {"prompt": "x", "model": LONE}, "model", "model"),
    ("/detokenize", {"tokens": [1], "model": LONE}, "model", "model"),
]


def _post_escaped(url: str, body: dict) -> httpx.Response:
    # ensure_ascii keeps the surrogate as a \uXXXX escape, as a client in any language may send it
    return httpx.post(url, content=json.dumps(body).encode(), headers={"content-type": "application/json"},
                      timeout=30)


@pytest.mark.parametrize("route,body,param,path", SURROGATES, ids=[f"{i}-{c[2]}" for i, c in enumerate(SURROGATES)])
def test_lone_surrogate_is_a_400_naming_the_field(server, route, body, param, path):
    r = _post_escaped(server.url + route, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "invalid_unicode", err
    assert path in err["message"] and "surrogate" in err["message"], err


def test_paired_surrogates_are_one_valid_character(server):
    # "\ud83d\ude00" is the JSON spelling of U+1F600: it must tokenize, not be refused
    r = _post_escaped(server.url + TOK, {"prompt": "smile \U0001F600"})
    assert r.status_code == 200, r.text
    assert b"\\ud83d\\ude00" in json.dumps({"p": "\U0001F600"}).encode()


def test_non_finite_numbers_are_refused(server):
    # Python's json accepts NaN and Infinity; JSON does not, and SamplingParams must never see them
    for raw in (b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "top_p": Infinity}'):
        r = httpx.post(server.url + CMPL, content=raw, headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_json"


# (body, param, words the message must contain): messages as the OpenAI API validates them
BAD_MESSAGES = [
    ({"messages": [{"role": "system"}]}, "messages", ["messages[0].content", "required"]),
    ({"messages": [{"role": "developer", "content": None}]}, "messages", ["messages[0].content"]),
    ({"messages": [{"role": "user"}]}, "messages", ["messages[0].content", "required"]),
    ({"messages": [*USER, {"role": "tool", "tool_call_id": "c1"}]}, "messages", ["messages[1].content"]),
    ({"messages": [*USER, {"role": "tool", "content": "42"}]}, "messages", ["messages[1].tool_call_id"]),
    ({"messages": [*USER, {"role": "assistant"}]}, "messages", ["messages[1]", "content", "tool_calls"]),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages", ["messages[0].name"]),
    ({"messages": [{"role": "user", "content": "hi", "colour": "red"}]}, "messages",
     ["messages[0].colour", "not permitted"]),
    ({"messages": [{"role": "system", "content": "x", "tool_call_id": "c"}]}, "messages",
     ["messages[0].tool_call_id"]),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages",
     ["messages[0].content[0].text"]),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]}, "messages",
     ["messages[0].content[0].x"]),
    ({"messages": [{"role": "alien", "content": "x"}]}, "messages", ["role", "system"]),
]


@pytest.mark.parametrize("route", [CHAT, TOK])
@pytest.mark.parametrize("body,param,words", BAD_MESSAGES, ids=[str(i) for i in range(len(BAD_MESSAGES))])
def test_message_without_content_or_with_unknown_keys_is_a_400(server, route, body, param, words):
    r = httpx.post(server.url + route, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    for word in words:
        assert word in err["message"], err


def test_valid_message_shapes_are_accepted(server):
    messages = [{"role": "system", "content": "Be brief.", "name": "sys"},
                {"role": "developer", "content": [{"type": "text", "text": "No lists."}]},
                {"role": "user", "content": "What is 6 x 7?", "name": "ann"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "mul", "arguments": "{\"a\": 6, \"b\": 7}"}}]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"},
                {"role": "assistant", "content": "42.", "refusal": None}]
    r = httpx.post(server.url + CHAT, json={"model": MODEL_NAME, "messages": messages, "max_tokens": 2,
                                            "ignore_eos": True}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    r = httpx.post(server.url + TOK, json={"messages": messages}, timeout=30)
    assert r.status_code == 200 and r.json()["count"] > 0, r.text


def test_server_is_healthy_after_bad_input(server):
    for route, body, *_ in SURROGATES:
        _post_escaped(server.url + route, body)
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert server.stats()["step_failures"] == 0
    server.wait_idle()
