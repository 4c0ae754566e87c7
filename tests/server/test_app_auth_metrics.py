"""API-key auth on /v1/*, Prometheus metrics under vLLM's names, the health and stats routes."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.harness import MODEL_NAME, serve

REQUIRED = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries",
            "prefix_cache_hits", "num_preemptions", "prompt_tokens", "generation_tokens", "request_success",
            "time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
            "request_queue_time_seconds"]


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))] = s.value
    return values


def test_metrics_names_and_counts(server):
    server.wait_idle()
    before = scrape(server.url)
    names = {name for name, _ in before}
    for metric in REQUIRED:
        assert any(n.startswith("cinq:" + metric) for n in names), metric
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
    for i in range(3):
        client.completions.create(model=MODEL_NAME, prompt=f"metrics {i}", max_tokens=5,
                                  extra_body={"ignore_eos": True})
    server.wait_idle()
    after = scrape(server.url)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert delta("cinq:generation_tokens_total") == 15
    assert delta("cinq:request_success_total", finished_reason="length") == 3
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "time_per_output_token_seconds"):
        assert delta(f"cinq:{hist}_count") == 3, hist
        assert delta(f"cinq:{hist}_sum") >= 0
    assert after[("cinq:num_requests_running", ())] == 0
    assert after[("cinq:kv_cache_usage_perc", ())] == 0
    stats = server.stats()
    assert after[("cinq:prompt_tokens_total", ())] == stats["prompt_tokens"]


def test_health_and_stats(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    s = server.stats()
    assert s["num_kv_blocks"] == server.engine.num_blocks and s["model"] == MODEL_NAME


@pytest.fixture(scope="module")
def secured(tiny_llama):
    with serve(tiny_llama, api_key="s3cret-key", num_kv_blocks=64) as srv:
        yield srv


@pytest.mark.parametrize("header", [None, "Bearer wrong", "s3cret-key", "Basic s3cret-key", "Bearer",
                                    "Bearer s3cret-keyX"])
def test_api_key_rejects(secured, header):
    headers = {"Authorization": header} if header is not None else {}
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")]:
        r = httpx.request(method, secured.url + path, headers=headers, json={"prompt": "x"})
        assert r.status_code == 401, (path, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"


def test_api_key_accepts_openai_client(secured):
    client = openai.OpenAI(base_url=secured.api, api_key="s3cret-key", max_retries=0)
    assert client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2).usage.prompt_tokens > 0
    bad = openai.OpenAI(base_url=secured.api, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    for path in ("/health", "/metrics", "/stats", "/"):  # only /v1 is guarded, as in vLLM
        assert httpx.get(secured.url + path).status_code == 200
