"""vLLM's extra request fields: logit_bias, allowed_token_ids and bad_words steer the reply; those cinq does not
implement are refused by name when they ask for something (they used to be accepted and silently ignored), and
accepted at the values that ask for nothing; the OpenAPI document says which values those are."""

from __future__ import annotations

import httpx
import pytest

from tests.server.harness import MODEL_NAME

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]

# (field, a value that asks for something, values that ask for nothing)
UNSUPPORTED = [
    ("guided_whitespace_pattern", r"[ ]?", [None]),
    ("guided_decoding_backend", "outlines", [None, "auto", "xgrammar"]),
]


def _post(server, route: str, extra: dict) -> httpx.Response:
    body = {"prompt": "x"} if route == CMPL else {"messages": USER}
    return httpx.post(server.url + route, json={"model": MODEL_NAME, "max_tokens": 1, **body, **extra}, timeout=30)


@pytest.mark.parametrize("route", [CMPL, CHAT])
@pytest.mark.parametrize("field,value,_", UNSUPPORTED, ids=[c[0] for c in UNSUPPORTED])
def test_an_unsupported_field_asking_for_something_is_a_400(server, route, field, value, _):
    r = _post(server, route, {field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"], err


@pytest.mark.parametrize("field,_,values", UNSUPPORTED, ids=[c[0] for c in UNSUPPORTED])
def test_an_unsupported_field_asking_for_nothing_is_accepted(server, field, _, values):
    for value in values:
        r = _post(server, CHAT, {field: value})
        assert r.status_code == 200, (value, r.text)


@pytest.mark.parametrize("options,param", [
    ({"backend": "outlines"}, "structured_outputs.backend"),
    ({"whitespace_pattern": " "}, "structured_outputs.whitespace_pattern"),
])
def test_structured_outputs_options_cinq_cannot_honour(server, options, param):
    r = _post(server, CMPL, {"structured_outputs": {"choice": ["a", "b"], **options}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    ok = _post(server, CMPL, {"structured_outputs": {"choice": ["a", "b"], "backend": "xgrammar",
                                                     "disable_any_whitespace": True}})
    assert ok.status_code == 200, ok.text


def test_the_schema_names_the_values_that_ask_for_nothing(server):
    props = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]
    props = props["properties"]
    for field, value, accepted in UNSUPPORTED:
        prop = props[field]
        if "enum" in prop:
            assert value not in prop["enum"] and all(v in prop["enum"] for v in accepted), field
        else:
            assert prop["anyOf"][0]["type"] == "array" and prop["maxItems"] == 0, field


@pytest.mark.parametrize("route", [CMPL, CHAT])
def test_logit_bias_and_allowed_token_ids_steer_the_reply(server, route):
    forced = _post(server, route, {"max_tokens": 4, "ignore_eos": True, "temperature": 0,
                                   "logit_bias": {"42": 100}, "logprobs": route == CHAT or 1})
    assert forced.status_code == 200, forced.text
    steered = _post(server, route, {"max_tokens": 6, "ignore_eos": True, "temperature": 1.0, "seed": 1,
                                    "allowed_token_ids": [5, 60], "logprobs": route == CHAT or 1})
    assert steered.status_code == 200, steered.text
    if route == CMPL:
        ids = [r.json()["choices"][0]["logprobs"]["tokens"] for r in (forced, steered)]
    else:
        ids = [[t["token"] for t in r.json()["choices"][0]["logprobs"]["content"]] for r in (forced, steered)]
    tok = server.llm.tokenizer
    names = [[tok.decode([i], skip_special_tokens=False) for i in allowed] for allowed in ([42], [5, 60])]
    assert set(ids[0]) == set(names[0]) and set(ids[1]) <= set(names[1])


def test_bad_words_win_over_a_logit_bias_and_blank_ones_are_refused(server):
    (x,) = httpx.post(server.url + "/tokenize", json={"prompt": "x", "add_special_tokens": False},
                      timeout=30).json()["tokens"]
    body = {"max_tokens": 6, "ignore_eos": True, "temperature": 0, "logit_bias": {str(x): 100}, "logprobs": 0}
    forced = _post(server, CMPL, body).json()["choices"][0]["text"]
    avoided = _post(server, CMPL, {**body, "bad_words": ["x"]})
    assert avoided.status_code == 200, avoided.text
    assert forced == "x" * 6 and "x" not in avoided.json()["choices"][0]["text"]
    blank = _post(server, CMPL, {"bad_words": ["  "]})
    assert blank.status_code == 400 and blank.json()["error"]["param"] == "bad_words"


@pytest.mark.parametrize("route", [CMPL, CHAT])
def test_prompt_logprobs_score_every_prompt_token(server, route, tokenizer):
    r = _post(server, route, {"prompt_logprobs": 2, "max_tokens": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    lps = body["choices"][0]["prompt_logprobs"] if route == CMPL else body["prompt_logprobs"]
    prompt = httpx.post(server.url + "/tokenize", json={"prompt": "x"} if route == CMPL else {"messages": USER},
                        timeout=30).json()["tokens"]
    assert len(lps) == len(prompt) == body["usage"]["prompt_tokens"] and lps[0] is None
    for token, entry in zip(prompt[1:], lps[1:]):
        assert str(token) in entry and len(entry) <= 3  # the top 2 and the prompt's own token
        ranks = sorted(e["rank"] for e in entry.values())
        assert ranks[:2] == [1, 2] and all(e["logprob"] <= 0 for e in entry.values())
        assert entry[str(token)]["decoded_token"] == tokenizer.decode([token], skip_special_tokens=False)
    streamed = _post(server, route, {"prompt_logprobs": 1, "stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"


@pytest.mark.parametrize("route", [CMPL, CHAT])
def test_return_tokens_as_token_ids_names_every_logprob_token_by_id(server, route, tokenizer):
    body = {"max_tokens": 4, "ignore_eos": True, "temperature": 0, "return_tokens_as_token_ids": True,
            "logit_bias": {"42": 100}}
    body.update({"logprobs": 2} if route == CMPL else {"logprobs": True, "top_logprobs": 2})
    r = _post(server, route, body)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    if route == CMPL:
        names, tops = lp["tokens"], [k for top in lp["top_logprobs"] for k in top]
        assert lp["text_offset"] == [0, 1, 2, 3]  # offsets into the text, which is "****"
    else:
        names = [c["token"] for c in lp["content"]]
        tops = [t["token"] for c in lp["content"] for t in c["top_logprobs"]]
        assert all(c["bytes"] == list(tokenizer.decode([42]).encode()) for c in lp["content"])
    assert names == ["token_id:42"] * 4 and all(t.startswith("token_id:") for t in tops) and len(tops) >= 8


@pytest.mark.parametrize("route", [CMPL, CHAT])
def test_use_beam_search_returns_the_offline_searchs_beams(server, route):
    from cinq import BeamSearchParams
    from cinq.engine.beam_search import BeamSearch

    r = _post(server, route, {"use_beam_search": True, "n": 3, "max_tokens": 4, "ignore_eos": True,
                              "length_penalty": 0.5})
    assert r.status_code == 200, r.text
    body = r.json()
    texts = [c["message"]["content"] if route == CHAT else c["text"] for c in body["choices"]]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    # the same search driven offline over this server's engine gives the same beams
    prompt = httpx.post(server.url + "/tokenize", json={"prompt": "x"} if route == CMPL else {"messages": USER},
                        timeout=30).json()["tokens"]
    assert body["usage"]["prompt_tokens"] == len(prompt) and body["usage"]["completion_tokens"] == 12
    search = BeamSearch(prompt, BeamSearchParams(3, 4, True, 0.0, 0.5), [], server.engine.max_model_len)
    step = search.params.step_params()
    while not search.done:
        outs = []
        for beam in search.live:
            rid = f"offline-{len(beam.tokens)}-{beam.tokens[-1]}-{len(outs)}"
            outs.append(_run_one(server, rid, beam.tokens, step))
        search.advance(outs)
    assert texts == [server.llm.tokenizer.decode(search.generated(b)) for b in search.result()]


def _run_one(server, rid, tokens, params):
    finished = []
    server.llm.finished_callbacks.append(finished.append)
    try:
        r = httpx.post(server.url + CMPL, json={"model": MODEL_NAME, "prompt": tokens, "max_tokens": 1,
                                                "logprobs": params.logprobs, "temperature": 0, "ignore_eos": True},
                       timeout=30)
        assert r.status_code == 200, r.text
        server.wait_idle()
    finally:
        server.llm.finished_callbacks.remove(finished.append)
    (out,) = finished
    return out


@pytest.mark.parametrize("extra,field", [({"stream": True}, "stream"), ({"logprobs": 1}, "logprobs"),
                                         ({"stop": ["a"]}, "stop"), ({"n": 11}, "n"),
                                         ({"top_p": 0.5}, "top_p")])
def test_use_beam_search_refuses_what_it_would_ignore(server, extra, field):
    r = _post(server, CMPL, {"use_beam_search": True, "n": 2, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_length_penalty_without_beam_search_is_refused(server):
    r = _post(server, CMPL, {"length_penalty": 0.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "length_penalty"
