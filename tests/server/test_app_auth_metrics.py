"""Prometheus metrics under vLLM's names (TPOT per sequence, n > 1 included), the health and stats routes. API-key
auth is tested in tests/reliability/test_api_key.py."""

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
    assert delta("cinq:prompt_tokens_total") == sum(len(server.llm.tokenizer.encode(f"metrics {i}"))
                                                    for i in range(3))


def test_prompt_tokens_count_every_prompt_whole_once(server):
    """vLLM's prompt_tokens_total: the same prompt sent twice adds its length twice, though the second time it is
    (almost) all prefix-cache hits; the hits have their own counter."""
    prompt = list(range(3, 53))  # 50 tokens
    server.wait_idle()
    before = scrape(server.url)
    for _ in range(2):
        r = httpx.post(server.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1,
                                                             "n": 2}, timeout=30)
        assert r.status_code == 200, r.text
    server.wait_idle()
    after = scrape(server.url)
    key = ("cinq:prompt_tokens_total", ())
    assert after[key] - before[key] == 2 * 50
    hits = ("cinq:prefix_cache_hits_total", ())
    assert after[hits] - before.get(hits, 0.0) >= 48  # the second request's 3 full blocks of 16


def test_health_and_stats(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    for method in ("GET", "POST"):  # vLLM's /ping: the health check under SageMaker's name
        r = httpx.request(method, server.url + "/ping")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
    from cinq import __version__
    assert httpx.get(server.url + "/version").json() == {"version": __version__}
    s = server.stats()
    assert s["num_kv_blocks"] == server.engine.num_blocks and s["model"] == MODEL_NAME


def _completion_capturing(server, body: dict):
    """POST a completion; return the finished engine output(s) seen by the metrics hook, and the scrape delta."""
    finished = []
    server.llm.finished_callbacks.append(finished.append)
    try:
        server.wait_idle()
        before = scrape(server.url)
        r = httpx.post(server.url + "/v1/completions", json={"model": MODEL_NAME, **body}, timeout=60)
        assert r.status_code == 200, r.text
        server.wait_idle()
        after = scrape(server.url)
    finally:
        server.llm.finished_callbacks.remove(finished.append)
    return finished, {k: after[k] - before.get(k, 0.0) for k in after}


def _stop_token_for_first_choice(server) -> tuple[int, int, int]:
    """(seed, token, position): with this seed, choice 0 of n = 2 generates ``token`` first at ``position`` < 7
    and choice 1 never does, so stopping on it ends choice 0 steps before choice 1."""
    for seed in range(20):
        (out,), _ = _completion_capturing(server, {"prompt": "tpot", "max_tokens": 8, "n": 2, "seed": seed,
                                                   "ignore_eos": True})
        a, b = (c.token_ids for c in sorted(out.outputs, key=lambda c: c.index))
        for pos, tok in enumerate(a[:6]):
            if tok not in b and tok not in a[:pos]:
                return seed, tok, pos
    raise AssertionError("no seed found where the two choices differ")


@pytest.mark.parametrize("stream", [False, True])
def test_tpot_is_per_sequence_for_n_choices(server, stream):
    """n = 2 choices, one stopped early: TPOT is (last - first token time) / (tokens per sequence - 1). A streamed
    request's final output holds only the choice that changed last, so n must not be read from it (it was:
    TPOT came out about half the truth for streamed n > 1 requests)."""
    seed, tok, pos = _stop_token_for_first_choice(server)
    (out,), delta = _completion_capturing(server, {
        "prompt": "tpot", "max_tokens": 8, "n": 2, "seed": seed, "ignore_eos": True, "stop_token_ids": [tok],
        "stream": stream, "temperature": 1.0})
    m = out.metrics
    assert m.num_generation_tokens == pos + 1 + 8
    if stream:
        assert len(out.outputs) == 1  # what made the old count wrong
    expected = (m.last_token_time - m.first_token_time) / (m.num_generation_tokens / 2 - 1)
    assert delta[("cinq:time_per_output_token_seconds_count", ())] == 1
    assert delta[("cinq:time_per_output_token_seconds_sum", ())] == pytest.approx(expected, rel=1e-6)


def test_metrics_keep_no_state_for_finished_or_aborted_requests(server):
    """The n kept per request for TPOT is dropped on finish and on abort (else it grows under soak)."""
    _completion_capturing(server, {"prompt": "x", "max_tokens": 3, "n": 3, "ignore_eos": True, "stream": True})
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", server.url + "/v1/completions", json={
                "model": MODEL_NAME, "prompt": "y", "max_tokens": 400, "n": 2, "ignore_eos": True,
                "stream": True}) as r:
            next(r.iter_lines())  # first event, then hang up mid-stream
    server.wait_idle()
    assert server.app.state.ctx.metrics._num_seqs == {}


def test_speculative_counters_use_vllms_names() -> None:
    from cinq.outputs import EngineStats, SpecDecodingStats
    from cinq.server.metrics import ServerMetrics
    stats = EngineStats(spec_decode_num_drafts=4, spec_decode_num_draft_tokens=12,
                        spec_decode_num_accepted_tokens=7, spec_decode_num_accepted_tokens_per_pos=[4, 2, 1],
                        spec_decode_by_language={"de": SpecDecodingStats(3, 9, 5)})
    text = ServerMetrics("m", lambda: stats).render().decode()
    assert 'cinq:spec_decode_num_drafts_total{model_name="m"} 4.0' in text
    assert 'cinq:spec_decode_num_accepted_tokens_total{model_name="m"} 7.0' in text
    assert 'cinq:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 1.0' in text
    # per language: the same names with a language label, beside the unlabelled totals
    assert 'cinq:spec_decode_num_drafts_total{language="de",model_name="m"} 3.0' in text
    assert 'cinq:spec_decode_num_draft_tokens_total{language="de",model_name="m"} 9.0' in text
    assert 'cinq:spec_decode_num_accepted_tokens_total{language="de",model_name="m"} 5.0' in text
    assert text.count("# TYPE cinq:spec_decode_num_drafts_total counter") == 1
