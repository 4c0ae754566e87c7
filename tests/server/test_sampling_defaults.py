"""Request fields the client omits come from the model's generation config (as vLLM's server fills them), then
from OpenAI's / SamplingParams' defaults; a field the client sends is never replaced."""

from __future__ import annotations

import json
import shutil

import httpx

from cinq.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.server.harness import MODEL_NAME, serve

DEFAULTS = {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1, "max_tokens": 96, "min_tokens": 24}
MESSAGES = [{"role": "user", "content": "hi"}]


def test_completions_omitted_fields_take_the_models_defaults():
    p = CompletionRequest(prompt="x").to_sampling_params(DEFAULTS)
    assert (p.temperature, p.top_p, p.repetition_penalty, p.max_tokens, p.min_tokens) == (0.7, 0.9, 1.1, 96, 24)
    p = CompletionRequest(prompt="x").to_sampling_params({})
    assert (p.temperature, p.max_tokens, p.min_tokens) == (1.0, 16, 0)  # OpenAI's 16 without model defaults


def test_sent_fields_win_and_a_smaller_max_tokens_lowers_the_models_minimum():
    p = CompletionRequest(prompt="x", temperature=0.0, max_tokens=5).to_sampling_params(DEFAULTS)
    assert (p.temperature, p.top_p, p.max_tokens, p.min_tokens) == (0.0, 0.9, 5, 5)
    p = CompletionRequest(prompt="x", max_tokens=0, echo=True, logprobs=1).to_sampling_params(DEFAULTS)
    assert (p.max_tokens, p.min_tokens) == (0, 0)  # lm-eval's prompt scoring still works
    p = CompletionRequest(prompt="x", max_tokens=None, min_tokens=0).to_sampling_params(DEFAULTS)
    assert (p.max_tokens, p.min_tokens) == (None, 0)  # an explicit null: up to the context


def test_chat_omitted_max_tokens_is_the_models_else_the_context():
    assert ChatCompletionRequest(messages=MESSAGES).to_sampling_params(DEFAULTS).max_tokens == 96
    assert ChatCompletionRequest(messages=MESSAGES).to_sampling_params({}).max_tokens is None
    p = ChatCompletionRequest(messages=MESSAGES, max_completion_tokens=3).to_sampling_params(DEFAULTS)
    assert (p.max_tokens, p.min_tokens, p.temperature) == (3, 3, 0.7)


def test_a_live_server_fills_omitted_fields_from_the_model(tiny_llama, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_llama, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, "temperature": 0.0, "min_new_tokens": 6,
                                                               "max_new_tokens": 6}))
    with serve(folder) as s:
        body = httpx.post(s.api + "/completions", json={"model": MODEL_NAME, "prompt": "abc"}, timeout=60).json()
        assert body["usage"]["completion_tokens"] == 6
        body = httpx.post(s.api + "/chat/completions", json={"messages": MESSAGES, "max_tokens": 2}, timeout=60).json()
        assert body["usage"]["completion_tokens"] == 2
