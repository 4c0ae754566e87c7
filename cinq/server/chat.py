"""POST /v1/chat/completions: messages rendered with the model's chat template (jinja2, from its tokenizer
config), then generated like a completion; the reply comes back whole or as ``chat.completion.chunk`` deltas."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse
from starlette.requests import Request

from cinq.engine.async_engine import RequestStream
from cinq.outputs import CompletionOutput
from cinq.server.context import Prompt, ServerContext, new_id
from cinq.server.errors import to_api_error
from cinq.server.logprobs import chat_logprobs
from cinq.server.protocol import ChatCompletionRequest
from cinq.server.streams import DONE, SSEResponse, final_outputs, merge_streams, sse, unless_disconnected


async def render_chat_prompt(ctx: ServerContext, req_messages: list[dict], add_generation_prompt: bool,
                             template_kwargs: dict | None) -> Prompt:
    """Apply the chat template and tokenize (the template writes the special tokens itself)."""
    text = ctx.tokenizer.apply_chat_template(req_messages, add_generation_prompt, **(template_kwargs or {}))
    return Prompt(await ctx.encode(text, add_special_tokens=False), text)


async def create_chat_completion(ctx: ServerContext, req: ChatCompletionRequest, raw: Request):
    ctx.check_model(req.model)
    params = req.to_sampling_params(ctx.default_sampling_params)
    prompt = await render_chat_prompt(ctx, req.template_messages(), req.add_generation_prompt,
                                      req.chat_template_kwargs)
    request_id = new_id("chatcmpl")
    streams = await ctx.add_all(request_id, [prompt], params, req.language)
    job = _Chat(ctx, req, request_id, prompt)
    if req.stream:
        return SSEResponse(job.stream(streams), streams, ctx.release)
    try:
        (out,) = await unless_disconnected(raw, final_outputs(streams))
    finally:
        ctx.release(streams)
    return JSONResponse(job.response(out.outputs))


class _Chat:
    def __init__(self, ctx: ServerContext, req: ChatCompletionRequest, request_id: str, prompt: Prompt) -> None:
        self.ctx, self.req, self.id, self.prompt = ctx, req, request_id, prompt
        self.created = int(time.time())

    def _logprobs(self, comp: CompletionOutput) -> dict | None:
        if not self.req.logprobs or comp.logprobs is None:
            return None
        return chat_logprobs(self.ctx.tokenizer, comp.token_ids, comp.logprobs, self.req.top_logprobs or 0)

    def _usage(self, completion_tokens: int) -> dict:
        n = len(self.prompt.token_ids)
        return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}

    def response(self, comps: list[CompletionOutput]) -> dict:
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": self._logprobs(c), "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                   for c in comps]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.ctx.model_name,
                "choices": choices, "usage": self._usage(sum(len(c.token_ids) for c in comps)),
                "system_fingerprint": None}

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.ctx.model_name, "choices": choices, "system_fingerprint": None}
        if self.req.include_usage:
            chunk["usage"] = usage
        return chunk

    async def stream(self, streams: list[RequestStream]) -> AsyncIterator[str]:
        generated = 0
        continuous = bool(self.req.stream_options and self.req.stream_options.continuous_usage_stats)
        try:
            # The role comes first, one chunk per choice, as OpenAI sends it.
            for i in range(self.req.n):
                yield sse(self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]))
            async for _, out in merge_streams(streams):
                choices = []
                for comp in out.outputs:
                    generated += len(comp.token_ids)
                    if not (comp.text or comp.finish_reason or (self.req.logprobs and comp.token_ids)):
                        continue  # tokens held back (partial character, possible stop string)
                    choices.append({"index": comp.index, "delta": {"content": comp.text} if comp.text else {},
                                    "logprobs": self._logprobs(comp), "finish_reason": comp.finish_reason,
                                    "stop_reason": comp.stop_reason})
                if choices:
                    yield sse(self._chunk(choices, self._usage(generated) if continuous else None))
            if self.req.include_usage:
                yield sse(self._chunk([], self._usage(generated)))
        except Exception as e:  # after the 200 has gone out, errors travel in the stream
            yield sse(to_api_error(e).body())
        yield DONE
