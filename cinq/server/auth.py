"""``--api-key``: every HTTP request carries ``Authorization: Bearer KEY`` or gets a 401 OpenAI-shaped error.

It is an ASGI middleware rather than a route dependency so that nothing escapes it: unknown paths and wrong methods
answer 401 too (an unauthenticated client learns nothing about the routes), and so do routes added later. Open
without a key: ``/health`` and its alias ``/ping`` (load balancers and orchestrators probe them bare), the
playground page ``/`` (static HTML holding no data; a browser cannot send a header to load it, and the page sends
the key on every call it makes), and ``/metrics`` unless ``metrics_require_key`` (vLLM leaves it open: Prometheus
scrapers rarely carry the key).
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from cinq.server.errors import APIError

OPEN_PATHS = frozenset({"/health", "/ping", "/"})


class APIKeyMiddleware:
    """Reject requests without the right bearer token before they reach any route."""

    def __init__(self, app: ASGIApp, api_key: str, metrics_require_key: bool = False) -> None:
        self.app = app
        # Compared as SHA-256 digests: hmac.compare_digest is constant-time for equal lengths, and digests make
        # every length equal, so the key's length does not leak either.
        self._digest = hashlib.sha256(api_key.encode()).digest()
        self.open_paths = OPEN_PATHS if metrics_require_key else OPEN_PATHS | {"/metrics"}

    def authorized(self, header: str) -> bool:
        """Whether an Authorization header value carries the key (scheme case-insensitive, as RFC 9110 says)."""
        scheme, _, token = header.partition(" ")
        candidate = hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).digest()
        # Both sides always run, so the time does not depend on which check failed.
        return hmac.compare_digest(candidate, self._digest) & (scheme.lower() == "bearer")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
        if self.authorized(header):
            await self.app(scope, receive, send)
            return
        error = APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'", None,
                         "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        await error.response()(scope, receive, send)
