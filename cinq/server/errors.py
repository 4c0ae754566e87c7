"""OpenAI-shaped errors: every failure the server reports is ``{"error": {"message", "type", "param", "code"}}``
with a 4xx status for anything the client sent (5xx only for the server's own faults)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from cinq.engine.async_engine import EngineDeadError, EngineOverloadedError, RequestFailedError
from cinq.errors import CinqError, PromptTooLongError
from cinq.server.messages import ROLE_ERROR

log = logging.getLogger(__name__)


class APIError(Exception):
    """An error to return as-is: HTTP status plus the OpenAI error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def to_api_error(exc: BaseException) -> APIError:
    """Map any exception met while serving a request to the error the client gets."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, PromptTooLongError):
        return APIError(400, str(exc), exc.param, "context_length_exceeded")
    if isinstance(exc, CinqError):
        return APIError(400, str(exc), exc.param, "invalid_value")
    if isinstance(exc, (ValidationError, RequestValidationError)):
        return _from_validation(exc.errors())
    if isinstance(exc, EngineOverloadedError):
        return APIError(503, str(exc), None, "overloaded", headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), None, "engine_unavailable")
    if isinstance(exc, RequestFailedError):
        return APIError(500, str(exc), None, "engine_error")
    log.error("unexpected error while serving a request", exc_info=exc)
    return APIError(500, f"internal server error: {type(exc).__name__}", None, "internal_error")


def _from_validation(errors: list[dict]) -> APIError:
    """The most specific pydantic error, with its location as a dotted field path (union branch names removed).

    Most specific = deepest location: for a value that fits no branch of a union (``content`` as a list of parts
    with a bad part), the branch that got furthest says what is wrong (``content[0].text: field required``),
    not the first branch tried (``content: not a string``)."""
    if not errors:
        return APIError(400, "invalid request body", None, "invalid_type")

    def location(e: dict) -> list:
        return [p for p in e.get("loc", ()) if p != "body" and not _is_branch_name(p)]

    err = max(errors, key=lambda e: len(location(e)))  # max keeps the first of equals: pydantic's order
    parts = location(err)
    if err.get("type") == ROLE_ERROR and isinstance(err.get("input"), dict):
        # the message's role is missing or unknown: say so of messages[i].role, as of any other missing key
        parts.append("role")
        err = {**err, "input": err["input"]["role"]} if "role" in err["input"] else {**err, "type": "missing"}
    path = ""
    for p in parts:
        path += f"[{p}]" if isinstance(p, int) else (f".{p}" if path else str(p))
    msg = err.get("msg", "invalid value")
    param = path.split(".")[0].split("[")[0] or None  # the top-level field, as OpenAI reports it
    if err.get("type") == "missing":
        return APIError(400, f"{path}: field required", param, "missing_required_parameter")
    if "input" in err and err.get("type") != "json_invalid":
        msg = f"{msg}, got {_short(err['input'])}"
    return APIError(400, f"{path}: {msg}" if path else msg, param, "invalid_type")


def _is_branch_name(part: object) -> bool:
    # pydantic names union members in error locations: 'str', 'list[int]', 'function-after[...]'...
    return isinstance(part, str) and (not part.isidentifier() or part in {"str", "int", "float", "bool", "list",
                                                                           "dict", "none"})


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def install_error_handlers(app: FastAPI) -> None:
    """Make FastAPI's own errors (404 route, 405, body validation) and stray exceptions OpenAI-shaped too."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        # Starlette puts the 405's Allow header on the exception; RFC 9110 requires it on the answer.
        return APIError(exc.status_code, str(exc.detail), None, code, headers=exc.headers).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return to_api_error(exc).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return to_api_error(exc).response()
