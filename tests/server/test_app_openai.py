"""The OpenAI API as the official `openai` client sees it: completions and chat, whole and streamed, n, stop
strings, logprobs, echo scoring (lm-evaluation-harness style) and usage counts against the tokenizer."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tests.server.harness import MODEL_NAME

PROMPT = "The quick brown fox jumps over"
GREEDY = {"temperature": 0.0}
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def stream_text(stream) -> tuple[dict[int, str], dict[int, str], object]:
    """Concatenated text and finish reason per choice index, plus the usage chunk's usage."""
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            piece = c.text if hasattr(c, "text") else (c.delta.content or "")
            texts[c.index] = texts.get(c.index, "") + piece
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    return texts, reasons, usage


def test_models_lists_the_served_model(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].model_extra["max_model_len"] == server.engine.max_model_len


def test_one_model_by_name(client, server):
    """GET /v1/models/{id}: the same object as in the list; an unknown id is OpenAI's 404 model_not_found."""
    assert client.models.retrieve(MODEL_NAME).model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("org/other-model")
    assert e.value.body["code"] == "model_not_found" and "org/other-model" in e.value.body["message"]


def test_completion_usage_matches_tokenizer(client, tokenizer):
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, extra_body=NO_EOS, **GREEDY)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.created > 0
    assert out.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12
    assert out.choices[0].finish_reason == "length"


def test_completion_stream_equals_non_stream(client):
    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=20, extra_body=NO_EOS, **GREEDY)
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=20, extra_body=NO_EOS,
                                       stream=True, stream_options={"include_usage": True}, **GREEDY)
    texts, reasons, usage = stream_text(stream)
    assert texts == {0: whole.choices[0].text}
    assert reasons == {0: "length"}
    assert usage.completion_tokens == 20 and usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_usage_and_stream(client, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    whole = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=10,
                                           extra_body=NO_EOS, **GREEDY)
    rendered = tokenizer.apply_chat_template(messages, True)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(tokenizer.encode(rendered, add_special_tokens=False))
    assert whole.usage.completion_tokens == 10
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=10, extra_body=NO_EOS,
                                            stream=True, stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_max_completion_tokens_is_max_tokens(client):
    out = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                         max_completion_tokens=3, extra_body=NO_EOS)
    assert out.usage.completion_tokens == 3


def test_n_choices_whole_and_streamed(client):
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, n=2, max_tokens=8, seed=7, temperature=1.0,
                                    extra_body=NO_EOS)
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert out.usage.completion_tokens == 16
    assert out.choices[0].text != out.choices[1].text  # different seeds per child
    stream = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], n=2,
                                            max_tokens=6, temperature=1.0, seed=3, stream=True,
                                            stream_options={"include_usage": True}, extra_body=NO_EOS)
    texts, reasons, usage = stream_text(stream)
    assert reasons == {0: "length", 1: "length"}
    assert usage.completion_tokens == 12


def test_batched_prompts_get_their_own_choices(client, tokenizer):
    prompts = ["one two", "three four five"]
    out = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=4, n=2, extra_body=NO_EOS)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in prompts)
    assert out.usage.completion_tokens == 16


def _stop_string(text: str) -> str:
    """A two-character piece of ``text`` that starts after its first characters (clean, printable)."""
    for i in range(3, len(text) - 2):
        piece = text[i:i + 2]
        if piece.isprintable() and "\ufffd" not in piece and not piece.isspace():
            return piece
    pytest.skip(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_text(client, stream):
    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=40, extra_body=NO_EOS, **GREEDY)
    text = whole.choices[0].text
    stop = _stop_string(text)
    expected = text[:text.index(stop)]
    kwargs = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=40, stop=[stop], extra_body=NO_EOS, **GREEDY)
    if stream:
        texts, reasons, _ = stream_text(client.completions.create(stream=True, **kwargs))
        assert texts[0] == expected and reasons[0] == "stop"
    else:
        out = client.completions.create(**kwargs)
        assert out.choices[0].text == expected
        assert out.choices[0].finish_reason == "stop"
        assert out.choices[0].model_extra["stop_reason"] == stop


def test_completion_logprobs(client):
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, logprobs=3, extra_body=NO_EOS,
                                    **GREEDY)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == out.usage.completion_tokens == 6
    assert "".join(lp.tokens) == out.choices[0].text or "\ufffd" in "".join(lp.tokens)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and 1 <= len(top) <= 4
        assert math.isclose(max(top.values()), value, abs_tol=1e-5)  # greedy: the chosen token is the best


def test_chat_logprobs(client):
    out = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hey"}],
                                         max_tokens=5, logprobs=True, top_logprobs=2, extra_body=NO_EOS, **GREEDY)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 5
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-5)
        assert entry.bytes == list(entry.token.encode())


@pytest.fixture(scope="module")
def hf_logprobs(tiny_llama):
    """Reference next-token log-probabilities from transformers on the same weights."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)

    def logprobs(ids: list[int]):
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return logprobs


def test_echo_scoring_matches_transformers(client, hf_logprobs):
    """Prompt scoring without generation: token-id prompt, echo, max_tokens 0, logprobs 1."""
    ids = [5, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]
    out = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=0, echo=True, logprobs=1,
                                    temperature=0.0)
    lp = out.choices[0].logprobs
    assert out.usage.completion_tokens == 0 and out.choices[0].finish_reason == "length"
    assert len(lp.token_logprobs) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    logp = hf_logprobs(ids)
    expected = [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=2e-4)
    greedy = [logp[i - 1].argmax().item() == ids[i] for i in range(1, len(ids))]
    is_top = [math.isclose(max(t.values()), v, abs_tol=1e-5)
              for t, v in zip(lp.top_logprobs[1:], lp.token_logprobs[1:])]
    assert is_top == greedy


def test_lm_eval_loglikelihood_payload(server, hf_logprobs):
    """The exact request lm-evaluation-harness' local-completions sends for loglikelihood (batched token-id
    prompts, max_tokens 1, echo, logprobs 1), read the way it reads it: token_logprobs[ctxlen:-1]."""
    contexts, continuations = [[5, 72, 101], [5, 119, 111, 114, 108]], [[108, 108, 111], [100]]
    prompts = [c + k for c, k in zip(contexts, continuations)]
    body = {"model": MODEL_NAME, "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}
    out = httpx.post(server.api + "/completions", json=body, timeout=30).json()
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1]
    for choice, ctx, prompt in zip(choices, contexts, prompts):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(prompt) + 1  # the prompt, then the one generated token
        scored = lp["token_logprobs"][len(ctx):-1]
        logp = hf_logprobs(prompt)
        assert scored == pytest.approx([logp[i - 1, prompt[i]].item() for i in range(len(ctx), len(prompt))],
                                       abs=2e-4)


def test_echo_prepends_prompt(client):
    kw = dict(model=MODEL_NAME, prompt="abc", max_tokens=3, temperature=0, extra_body=NO_EOS)
    out = client.completions.create(echo=True, **kw)
    gen = client.completions.create(**kw)
    assert out.choices[0].text == "abc" + gen.choices[0].text and gen.usage.completion_tokens == 3


def test_batched_token_prompts_start_in_one_engine_step(client, server):
    server.wait_idle()
    before = server.engine.get_stats().num_steps
    out = client.completions.create(model=MODEL_NAME, prompt=[[5 + i, 6, 7] for i in range(8)], max_tokens=1,
                                    extra_body=NO_EOS)
    assert len(out.choices) == 8
    # One prefill step for the whole batch (not one step per prompt); allow one spare for a racing drain.
    assert server.engine.get_stats().num_steps - before <= 2


def test_chat_template_kwargs_cannot_replace_fixed_variables(client):
    out = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2, extra_body={**NO_EOS, "chat_template_kwargs": {
                                             "bos_token": "X", "messages": [], "eos_token": "Y"}})
    assert out.usage.completion_tokens == 2


def test_tokenize_detokenize_roundtrip(server, tokenizer):
    r = httpx.post(server.url + "/tokenize", json={"prompt": "héllo wörld"}).json()
    assert r["tokens"] == tokenizer.encode("héllo wörld") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == server.engine.max_model_len
    back = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == "héllo wörld"
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)


def test_content_parts_and_user_field(client):
    out = client.chat.completions.create(
        model=MODEL_NAME, user="someone", max_tokens=2, extra_body=NO_EOS,
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert out.usage.completion_tokens == 2
