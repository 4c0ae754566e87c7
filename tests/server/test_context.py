"""ServerContext: a prompt too long for the context in any tokenization is refused before it is tokenized (a huge
prompt used to hold the tokenizer, and with it the whole server, for seconds); the rest are tokenized as before,
long ones off the event loop."""

from __future__ import annotations

import httpx
import pytest

from cinq.model.tokenizer import Tokenizer
from tests.server.harness import MODEL_NAME

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture
def no_tokenizing(monkeypatch):
    def tokenized(*_args, **_kwargs):
        raise AssertionError("the prompt was tokenized")
    monkeypatch.setattr(Tokenizer, "encode", tokenized)
    monkeypatch.setattr(Tokenizer, "backend_tokenizer", property(tokenized))


def _post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + route, json={"model": MODEL_NAME, **body}, timeout=60)


def test_the_bound_is_the_longest_token_times_the_context(server):
    # the tiny model's byte tokenizer: its longest string is the special token "<|assistant|>" (13 bytes)
    assert server.app.state.ctx.max_prompt_bytes == 13 * server.engine.max_model_len


@pytest.mark.parametrize("route,body,param", [
    (CMPL, lambda text: {"prompt": text}, "prompt"),
    (CMPL, lambda text: {"prompt": ["short", text]}, "prompt"),
    (CMPL, lambda text: {"prompt": text, "stream": True}, "prompt"),
    (CHAT, lambda text: {"messages": [{"role": "user", "content": text}]}, "messages"),
], ids=["prompt", "prompt-list", "stream", "chat"])
def test_a_prompt_over_the_bound_is_refused_untokenized(server, no_tokenizing, route, body, param):
    limit = server.app.state.ctx.max_prompt_bytes
    r = _post(server, route, body("x" * (limit + 1)))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == param, err
    assert str(server.engine.max_model_len) in err["message"] and f"at most {limit} bytes" in err["message"], err
    if route == CMPL:
        assert f"{limit + 1} bytes" in err["message"], err


def test_bytes_not_characters_are_counted(server, no_tokenizing):
    limit = server.app.state.ctx.max_prompt_bytes
    text = "é" * (limit // 2 + 1)  # fewer characters than the bound, more bytes
    r = _post(server, CMPL, {"prompt": text})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert f"{len(text.encode())} bytes" in r.json()["error"]["message"]


def test_prompts_within_the_bound_are_tokenized_as_before(server, tokenizer):
    limit = server.app.state.ctx.max_prompt_bytes
    # exactly the bound: tokenized, then refused for its token count as before
    r = _post(server, CMPL, {"prompt": "x" * limit})
    assert r.status_code == 400, r.text
    assert f"the prompt has {limit + 1} tokens" in r.json()["error"]["message"], r.text
    ok = _post(server, CMPL, {"prompt": "hello", "max_tokens": 2, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == len(tokenizer.encode("hello"))
    # /tokenize has no context limit (vLLM's neither): a text past the bound is counted, off the event loop
    text = "abc é " * (limit // 4)
    r = httpx.post(server.url + "/tokenize", json={"prompt": text}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens"] == tokenizer.encode(text), r.text[:200]
    server.wait_idle()


@pytest.mark.parametrize("route", [CMPL, CHAT])
def test_truncate_prompt_tokens_cuts_a_prompt_past_the_bound_instead_of_refusing_it(server, tokenizer, route):
    context = server.engine.max_model_len
    text = "ab " * (13 * context)  # past the byte bound: refused untokenized without the field
    body = {"prompt": text} if route == CMPL else {"messages": [{"role": "user", "content": text}]}
    assert _post(server, route, {**body, "max_tokens": 2}).json()["error"]["code"] == "context_length_exceeded"
    r = _post(server, route, {**body, "max_tokens": 2, "ignore_eos": True, "truncate_prompt_tokens": 10})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 10  # usage counts what the model saw, as vLLM's
    if route == CMPL:  # echo shows the kept text
        echoed = _post(server, CMPL, {"prompt": text, "max_tokens": 0, "echo": True, "truncate_prompt_tokens": 4})
        kept = tokenizer.encode(text)[-4:]
        assert echoed.json()["choices"][0]["text"] == tokenizer.decode(kept, skip_special_tokens=False)
    too_far = _post(server, route, {**body, "truncate_prompt_tokens": context + 1})
    err = too_far.json()["error"]
    assert too_far.status_code == 400 and err["param"] == "truncate_prompt_tokens" and str(context) in err["message"]
