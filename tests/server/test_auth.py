"""APIKeyMiddleware's open paths: the probes (/health and vLLM's /ping) and the playground answer without the key;
every other path needs it. (The whole key check is tested in tests/reliability/test_api_key.py.)"""

from __future__ import annotations

import pytest
from starlette.responses import PlainTextResponse
from starlette.testclient import TestClient

from cinq.server.auth import APIKeyMiddleware


async def _ok(scope, receive, send) -> None:
    await PlainTextResponse("ok")(scope, receive, send)


@pytest.mark.parametrize("path,status", [("/health", 200), ("/ping", 200), ("/", 200), ("/version", 401),
                                         ("/v1/models", 401), ("/v1/models/tiny", 401), ("/pingx", 401)])
def test_probes_are_open_and_the_rest_needs_the_key(path, status):
    client = TestClient(APIKeyMiddleware(_ok, "secret"))
    assert client.get(path).status_code == status
    assert client.get(path, headers={"Authorization": "Bearer secret"}).status_code == 200
