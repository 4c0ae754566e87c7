"""The FastAPI application: OpenAI-compatible routes over one EngineClient (by default the engine core in its
own process), plus health, metrics, tokenizer routes, live engine stats and the playground page.

Request bodies are parsed by hand (not by FastAPI's signature magic) so that every malformed body — bad JSON,
wrong types, out-of-range values, text that is not valid Unicode — becomes a 4xx with an OpenAI-shaped error
naming the field; the OpenAPI document that FastAPI can therefore not infer is built by server/openapi.py.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from cinq import __version__
from cinq.engine.protocol import EngineClient
from cinq.outputs import EngineStats, mean_acceptance_length
from cinq.server.auth import APIKeyMiddleware
from cinq.server.body import read_json_object
from cinq.server.chat import create_chat_completion
from cinq.server.chat_prompt import render_chat_prompt
from cinq.server.completions import create_completion
from cinq.server.context import ServerContext
from cinq.server.errors import APIError, install_error_handlers, to_api_error
from cinq.server.messages import template_messages
from cinq.server.metrics import CONTENT_TYPE, ServerMetrics
from cinq.server.openapi import build_openapi
from cinq.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from cinq.server.stats_logger import StatsLogger
from cinq.server.streams import ClientDisconnected
from cinq.spec.config import SpeculativeConfig

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
M = TypeVar("M", bound=BaseModel)


def build_app(llm: EngineClient, model_names: list[str], model_path: str, api_key: str | None = None,
              metrics_require_api_key: bool = False, log_stats_interval: float = 0.0) -> FastAPI:
    """The server for ``llm``; the engine loop starts and stops with the app's lifespan. With ``api_key`` every
    route but ``/health`` and the playground page needs it (``/metrics`` only with ``metrics_require_api_key``).
    ``log_stats_interval`` > 0: log throughput, queues and KV usage that often while there is load
    (``cinq.server.stats_logger``; 0: off)."""
    metrics = ServerMetrics(model_names[0], llm.get_stats)
    llm.finished_callbacks.append(metrics.observe_finished)
    ctx = ServerContext(llm, list(model_names), model_path, metrics, api_key or None)
    schema = build_openapi(ctx.llm.vocab_size, ctx.llm.max_model_len, ctx.api_key is not None, metrics_require_api_key,
                           empty_text_ok=bool(ctx.llm.tokenizer.encode("")), version=__version__)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        llm.start()
        stats_logger = None
        if log_stats_interval > 0:
            stats_logger = StatsLogger(llm.get_stats, lambda: llm.stats_time, log_stats_interval)
            stats_logger.start()
        try:
            yield
        finally:
            if stats_logger is not None:
                await stats_logger.stop()
            await llm.shutdown_async()  # waits for the engine thread off the event loop

    app = FastAPI(title="cinq", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    install_error_handlers(app)
    if ctx.api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=ctx.api_key, metrics_require_key=metrics_require_api_key)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> dict:
        return schema

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await _serve(raw, CompletionRequest, lambda req: create_completion(ctx, req, raw))

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await _serve(raw, ChatCompletionRequest, lambda req: create_chat_completion(ctx, req, raw))

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": ctx.created, "owned_by": "cinq", "root": ctx.model_path,
                "parent": None, "max_model_len": ctx.llm.max_model_len, "permission": []}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card(name) for name in ctx.model_names]}

    @app.get("/v1/models/{model_id:path}")  # :path: served names may hold a slash ("org/model")
    async def model(model_id: str) -> dict:
        ctx.check_model(model_id)  # an unknown name: OpenAI's 404 model_not_found (the APIError handler)
        return model_card(model_id)

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> Response:
        async def run(req: TokenizeRequest) -> dict:
            ctx.check_model(req.model)
            if (req.prompt is None) == (req.messages is None):
                raise APIError(400, "send exactly one of prompt or messages", "prompt", "invalid_value")
            if req.messages is not None:
                msgs = template_messages(req.messages)
                ids = (await render_chat_prompt(ctx, msgs, req.generation_prompt(), None,
                                                req.continue_final_message)).token_ids
            else:
                ids = await ctx.encode(req.prompt, req.add_special_tokens)  # type: ignore[arg-type]
            return {"count": len(ids), "max_model_len": ctx.llm.max_model_len, "tokens": ids}
        return await _serve(raw, TokenizeRequest, run)

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> Response:
        async def run(req: DetokenizeRequest) -> dict:
            ctx.check_model(req.model)
            ctx.check_token_ids(req.tokens, "tokens")
            return {"prompt": ctx.llm.tokenizer.decode(req.tokens)}
        return await _serve(raw, DetokenizeRequest, run)

    @app.get("/health")
    async def health() -> Response:
        if not llm.is_running:
            why = f"the engine core {llm.dead_error}" if llm.dead_error else "the engine loop is not running"
            return APIError(503, why, None, "engine_unavailable").response()
        return JSONResponse({"status": "ok"})

    # vLLM's /ping (SageMaker's probe, GET or POST): the health check under another name
    app.add_api_route("/ping", health, methods=["GET", "POST"])

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/stats")
    async def stats() -> dict:
        """Live engine state for the playground (JSON; /metrics has the same for Prometheus)."""
        s = llm.get_stats()
        return {"model": ctx.model_name, "time": llm.stats_time, "num_requests_running": s.num_running,
                "num_requests_waiting": s.num_waiting, "kv_cache_usage": s.kv_cache_usage,
                "num_kv_blocks": s.num_kv_blocks, "max_model_len": ctx.llm.max_model_len,
                "prompt_tokens": s.prompt_tokens, "generation_tokens": s.generation_tokens,
                "num_steps": s.num_steps, "num_preemptions": s.num_preemptions,
                "prefix_cache_hit_rate": s.prefix_cache_hit_rate, "finished_by_reason": s.finished_by_reason,
                "step_failures": llm.num_step_failures,
                "spec_decode": _spec_decode_stats(s, llm.config.speculative_config)}

    @app.get("/", response_class=HTMLResponse)
    async def playground() -> HTMLResponse:
        return HTMLResponse((STATIC_DIR / "index.html").read_text(encoding="utf-8"))

    return app


def _spec_decode_stats(s: EngineStats, spec: SpeculativeConfig | None) -> dict | None:
    """Speculative decoding for the playground: None when the server does not speculate, else vLLM's counters
    and tau (mean acceptance length), overall and per language tag."""
    if spec is None:
        return None

    def counts(drafts: int, draft_tokens: int, accepted: int) -> dict:
        return {"num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted,
                "mean_acceptance_length": mean_acceptance_length(accepted, drafts) or 0.0}

    return {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
            **counts(s.spec_decode_num_drafts, s.spec_decode_num_draft_tokens, s.spec_decode_num_accepted_tokens),
            "by_language": {lang: counts(c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens)
                            for lang, c in sorted(s.spec_decode_by_language.items())}}


async def _serve(raw: Request, model: type[M], handler) -> Response:
    """Parse the body into ``model``, run ``handler`` and turn every failure into an OpenAI error response."""
    try:
        req = model.model_validate(await read_json_object(raw))
        result = await handler(req)
        return result if isinstance(result, Response) else JSONResponse(result)
    except (ClientDisconnected, ClientDisconnect):  # gone mid-body (or timed out) or before the answer
        return Response(status_code=499)  # nobody is listening; nginx's code for it
    except Exception as e:
        return to_api_error(e).response()

