"""continue_final_message (vLLM's chat extra): the final assistant message is left open, so the prompt ends with its
content and the model goes on writing it, in /v1/chat/completions and /tokenize; misuse is a 400 naming it."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.harness import MODEL_NAME

CHAT = "/v1/chat/completions"
PREFILL = "Once upon a time"
CONVERSATION = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": PREFILL}]


def test_tokenize_leaves_the_final_message_open(server, tokenizer):
    r = httpx.post(server.url + "/tokenize", json={"messages": CONVERSATION, "continue_final_message": True,
                                                   "add_generation_prompt": False}, timeout=30)
    assert r.status_code == 200, r.text
    ids, content = r.json()["tokens"], tokenizer.encode(PREFILL, add_special_tokens=False)
    assert ids[-len(content):] == content  # not the end-of-turn token the template writes after it
    closed = httpx.post(server.url + "/tokenize", json={"messages": CONVERSATION, "add_generation_prompt": False},
                        timeout=30).json()["tokens"]
    assert closed[-1] in tokenizer.eos_token_ids and closed[:len(ids)] == ids


def test_chat_continues_the_final_message(server, tokenizer):
    finished = []
    server.llm.finished_callbacks.append(finished.append)
    try:
        # add_generation_prompt left out: its default (true) gives way, as only an explicit true clashes
        r = httpx.post(server.url + CHAT, json={"model": MODEL_NAME, "messages": CONVERSATION, "max_tokens": 3,
                                                "ignore_eos": True, "continue_final_message": True}, timeout=60)
        assert r.status_code == 200, r.text
        server.wait_idle()
    finally:
        server.llm.finished_callbacks.remove(finished.append)
    (out,) = finished
    content = tokenizer.encode(PREFILL, add_special_tokens=False)
    assert out.prompt_token_ids[-len(content):] == content
    assert r.json()["usage"]["prompt_tokens"] == len(out.prompt_token_ids)


@pytest.mark.parametrize("content", ["", "  "])
def test_a_blank_final_message_is_opened_empty(server, tokenizer, content):
    # vLLM accepts it (schemathesis found the 400 we gave); the prompt ends where the message's text would begin
    final = {"role": "assistant", "content": content}
    opened = httpx.post(server.url + "/tokenize", json={"messages": [*CONVERSATION[:1], final],
                                                        "continue_final_message": True}, timeout=30)
    assert opened.status_code == 200, opened.text
    with_text = httpx.post(server.url + "/tokenize", json={"messages": CONVERSATION, "continue_final_message": True},
                           timeout=30).json()["tokens"]
    ids = opened.json()["tokens"]
    assert ids == with_text[:len(ids)] and len(with_text) - len(ids) == len(
        tokenizer.encode(PREFILL, add_special_tokens=False))
    assert ids[-1] not in tokenizer.eos_token_ids


@pytest.mark.parametrize("route", [CHAT, "/tokenize"])
def test_misuse_is_a_400_naming_the_field(server, route):
    body = {"messages": CONVERSATION, "continue_final_message": True, "add_generation_prompt": True}
    r = httpx.post(server.url + route, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "continue_final_message" and "Cannot set both" in err["message"], err


@pytest.mark.parametrize("stream", [False, True])
def test_echo_prepends_the_final_assistant_message(server, stream):
    body = {"model": MODEL_NAME, "messages": CONVERSATION, "max_tokens": 3, "ignore_eos": True, "temperature": 0,
            "continue_final_message": True, "add_generation_prompt": False, "stream": stream}
    plain = httpx.post(server.url + CHAT, json={**body, "stream": False}, timeout=60).json()
    r = httpx.post(server.url + CHAT, json={**body, "echo": True}, timeout=60)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    else:
        content = r.json()["choices"][0]["message"]["content"]
    assert content == PREFILL + plain["choices"][0]["message"]["content"]
    # a final user message is not echoed (vLLM echoes the assistant's own turn only)
    asked = httpx.post(server.url + CHAT, json={"model": MODEL_NAME, "messages": CONVERSATION[:1], "max_tokens": 2,
                                                "echo": True, "temperature": 0, "ignore_eos": True}, timeout=60)
    assert not asked.json()["choices"][0]["message"]["content"].startswith("Tell me")
