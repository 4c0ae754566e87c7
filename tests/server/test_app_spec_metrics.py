"""The ``language`` body field (cinq's extra, like vLLM's extra body fields): accepted on completions and chat,
refused with a 400 naming it when it is no short tag; on a speculating server it labels the spec_decode counters
in /metrics (``language="de"``, the unlabelled series still the totals) and in /stats, which the playground polls.
Responses stay OpenAI's schema."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.server.harness import MODEL_NAME, RunningServer, serve
from tests.server.test_app_auth_metrics import scrape

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
SPEC = ("cinq:spec_decode_num_drafts_total", "cinq:spec_decode_num_draft_tokens_total",
        "cinq:spec_decode_num_accepted_tokens_total")
FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
USER = [{"role": "user", "content": "hello hello hello hello"}]


@pytest.fixture(scope="module")
def spec_server(tiny_llama) -> Iterator[RunningServer]:
    with serve(tiny_llama, max_num_seqs=16, speculative_config=NGRAM) as s:
        yield s


def _finished(server: RunningServer, posts: list[tuple[str, dict]]) -> tuple[list, dict, dict]:
    """POST each body; return the engine's finished outputs, the /metrics delta and /stats after."""
    finished = []
    server.llm.finished_callbacks.append(finished.append)
    try:
        server.wait_idle()
        before = scrape(server.url)
        for route, body in posts:
            r = httpx.post(server.url + route, json={"model": MODEL_NAME, **body}, timeout=120)
            assert r.status_code == 200, r.text
        server.wait_idle()
        after = scrape(server.url)
    finally:
        server.llm.finished_callbacks.remove(finished.append)
    return finished, {k: after[k] - before.get(k, 0.0) for k in after}, server.stats()


def test_language_labels_the_spec_decode_counters(spec_server) -> None:
    greedy = {"temperature": 0, "max_tokens": 40, "ignore_eos": True}
    posts = [("/v1/completions", {"prompt": "abcabcabc", "language": "de", **greedy}),
             ("/v1/completions", {"prompt": ["0101010101", "xyxyxyxy"], "language": "py", **greedy}),
             ("/v1/chat/completions", {"messages": USER, "language": "de", "stream": True, **greedy}),
             ("/v1/completions", {"prompt": "the cat and the cat and", **greedy})]  # untagged
    finished, delta, stats = _finished(spec_server, posts)
    assert len(finished) == 5
    by_prompt = {"abcabcabc": "de", "0101010101": "py", "xyxyxyxy": "py", "the cat and the cat and": None}
    tags = {o.request_id: by_prompt.get(o.prompt, "de") for o in finished}  # the chat's prompt is its template
    metric = {"num_drafts": SPEC[0], "num_draft_tokens": SPEC[1], "num_accepted_tokens": SPEC[2]}
    for field, name in metric.items():
        total = sum(getattr(o.metrics, field) for o in finished)
        assert delta[(name, ())] == total, field  # the unlabelled series: every request, as before
        for lang in ("de", "py"):
            mine = sum(getattr(o.metrics, field) for o in finished if tags[o.request_id] == lang)
            assert delta[(name, (("language", lang),))] == mine, (field, lang)
            assert stats["spec_decode"]["by_language"][lang][field] >= mine
        untagged = sum(getattr(o.metrics, field) for o in finished if tags[o.request_id] is None)
        assert total - delta[(name, (("language", "de"),))] - delta[(name, (("language", "py"),))] == untagged
    assert delta[(SPEC[2], (("language", "de"),))] > 0 and delta[(SPEC[2], (("language", "py"),))] > 0
    spec = stats["spec_decode"]
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 3
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_tokens"] / spec["num_drafts"])
    de = spec["by_language"]["de"]
    assert de["mean_acceptance_length"] == pytest.approx(1 + de["num_accepted_tokens"] / de["num_drafts"])


def test_responses_stay_openais_schema_with_a_language(spec_server) -> None:
    client = openai.OpenAI(base_url=spec_server.api, api_key="unused", max_retries=0)
    r = client.completions.create(model=MODEL_NAME, prompt="abcabc", max_tokens=8, extra_body={"language": "de"})
    body = r.model_dump(exclude_unset=True)
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert set(body["choices"][0]) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
    c = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=8, extra_body={"language": "de"})
    assert set(c.model_dump(exclude_unset=True)["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("bad", ["", "x" * 33, "de DE", "de/../x", "ü", 5, ["de"]])
def test_a_bad_language_is_a_400_naming_the_field(server, route, bad) -> None:
    body = {"prompt": "x"} if route == "/v1/completions" else {"messages": USER}
    r = httpx.post(server.url + route, json={"model": MODEL_NAME, "max_tokens": 2, "language": bad, **body},
                   timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "language" and "language" in err["message"], err


def test_language_is_accepted_without_speculation_and_stats_say_none(server) -> None:
    r = httpx.post(server.url + "/v1/completions", timeout=30,
                   json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 2, "language": "de-CH_1"})
    assert r.status_code == 200, r.text
    assert server.stats()["spec_decode"] is None
    assert not any(dict(labels).get("language") for _, labels in scrape(server.url))


def test_language_is_in_the_openapi_schema(server) -> None:
    doc = httpx.get(server.url + "/openapi.json", timeout=10).json()
    for req in ("CompletionRequest", "ChatCompletionRequest"):
        prop = doc["components"]["schemas"][req]["properties"]["language"]
        assert prop["maxLength"] == 32 and prop["pattern"] == "^[A-Za-z0-9_-]+$"
