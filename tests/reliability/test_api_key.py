"""`--api-key`: every route but /health (and the static playground page) answers 401 JSON without the right bearer
token, whatever the method or path (unknown ones included); /metrics is open unless --metrics-require-api-key; the
key is compared through hmac.compare_digest."""

from __future__ import annotations

import hmac

import httpx
import openai
import pytest

from tests.server.harness import MODEL_NAME, serve

KEY = "s3cret-key"
WRONG = [None, "", "Bearer", "Bearer wrong", KEY, "Basic " + KEY, "Bearer " + KEY + "X", "Bearer  " + KEY + "x",
         "Bearer " + KEY[:-1], "Token " + KEY, "Bearer s3cret-k\xe9y".encode("latin-1")]
# every route the app serves (from its schema) plus ones it does not, with a wrong method too
ROUTES = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
          ("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/stats"), ("GET", "/openapi.json"),
          ("GET", "/v1/completions"), ("DELETE", "/v1/models"), ("GET", "/v1/nothing"), ("POST", "/admin"),
          ("GET", "/version"), ("GET", "/v1/models/{model_id}")]


@pytest.fixture(scope="module")
def secured(tiny_llama):
    with serve(tiny_llama, api_key=KEY, num_kv_blocks=64) as srv:
        yield srv


@pytest.fixture(scope="module")
def secured_metrics(tiny_llama):
    with serve(tiny_llama, api_key=KEY, num_kv_blocks=32, metrics_require_api_key=True) as srv:
        yield srv


def _headers(value: str | bytes | None) -> dict:
    return {} if value is None else {"Authorization": value}


def test_routes_in_the_schema_are_all_covered(secured):
    doc = httpx.get(secured.url + "/openapi.json", headers=_headers("Bearer " + KEY)).json()
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    guarded = {r for r in listed if r[1] not in ("/health", "/ping", "/", "/metrics")}
    assert guarded <= set(ROUTES), guarded - set(ROUTES)
    assert doc["security"] == [{"bearer": []}] and doc["paths"]["/health"]["get"]["security"] == []


@pytest.mark.parametrize("header", WRONG, ids=[repr(h) for h in WRONG])
def test_missing_or_wrong_key_is_401_json_everywhere(secured, header):
    for method, path in ROUTES:
        r = httpx.request(method, secured.url + path, headers=_headers(header), json={"prompt": "x"}, timeout=10)
        assert r.status_code == 401, (method, path, r.status_code, r.text)
        assert r.headers["content-type"] == "application/json" and r.headers["www-authenticate"] == "Bearer"
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error", err


def test_right_key_passes_everywhere(secured):
    ok = _headers("bearer " + KEY)  # the scheme is case-insensitive
    assert httpx.post(secured.url + "/tokenize", headers=ok, json={"prompt": "hi"}).status_code == 200
    assert httpx.post(secured.url + "/detokenize", headers=ok, json={"tokens": [1]}).status_code == 200
    assert httpx.get(secured.url + "/stats", headers=ok).status_code == 200
    assert httpx.get(secured.url + "/v1/nothing", headers=ok).status_code == 404  # past auth, then routing
    client = openai.OpenAI(base_url=secured.api, api_key=KEY, max_retries=0)
    assert client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2).usage.prompt_tokens > 0
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=secured.api, api_key="nope", max_retries=0).models.list()


def test_health_playground_and_by_default_metrics_stay_open(secured):
    for path in ("/health", "/", "/metrics"):
        assert httpx.get(secured.url + path).status_code == 200, path


def test_metrics_require_api_key(secured_metrics):
    assert httpx.get(secured_metrics.url + "/metrics").status_code == 401
    assert httpx.get(secured_metrics.url + "/metrics", headers=_headers("Bearer " + KEY)).status_code == 200
    assert httpx.get(secured_metrics.url + "/health").status_code == 200


def test_key_is_compared_with_compare_digest(secured, monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert httpx.get(secured.url + "/v1/models", headers=_headers("Bearer x")).status_code == 401
    assert httpx.get(secured.url + "/v1/models", headers=_headers("Bearer " + KEY * 40)).status_code == 401
    # digests of equal length whatever the key's: the comparison time does not depend on the token's length
    assert calls == [(32, 32), (32, 32)]
