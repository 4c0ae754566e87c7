"""POST /v1/chat/completions: messages rendered with the model's chat template (jinja2, from its tokenizer
config; server/chat_prompt.py), then generated like a completion; the reply comes back whole or as
``chat.completion.chunk`` deltas."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse
from starlette.requests import Request

from cinq.engine.async_engine import RequestStream
from cinq.errors import CinqError
from cinq.outputs import CompletionOutput, RequestOutput
from cinq.server.chat_prompt import render_chat_prompt
from cinq.engine.beam_search import BeamSearchSequence
from cinq.server.beam_search import beam_search_all
from cinq.server.beam_search import usage as beam_usage
from cinq.server.context import Prompt, ServerContext, new_id
from cinq.server.errors import to_api_error
from cinq.server.logprobs import chat_logprobs, prompt_logprobs
from cinq.server.protocol import ChatCompletionRequest, rename_max_tokens
from cinq.server.streams import DONE, SSEResponse, final_outputs, merge_streams, sse, unless_disconnected
from cinq.server.structured import add_all_naming
from cinq.server.tools import ToolCallStreamer, prepare_messages


async def create_chat_completion(ctx: ServerContext, req: ChatCompletionRequest, raw: Request):
    ctx.check_model(req.model)
    params = req.to_sampling_params(ctx.llm.default_sampling_params)
    ctx.check_token_ids(params.stop_token_ids, "stop_token_ids")
    add_generation_prompt = req.generation_prompt()
    # tools: given to a template that renders them, else described in a system message (server/tools.py)
    messages, tool_kwargs = prepare_messages(req.template_messages(), req._tool_plan,
                                             "tools" in (ctx.llm.tokenizer.chat_template or ""))
    truncating = params.truncate_prompt_tokens is not None  # then a long conversation is cut, not refused
    prompt = ctx.truncate(await render_chat_prompt(ctx, messages, add_generation_prompt,
                                                   {**tool_kwargs, **(req.chat_template_kwargs or {})},
                                                   req.continue_final_message,
                                                   limit_param=None if truncating else "messages"), params)
    request_id = new_id("chatcmpl")
    if req.use_beam_search:
        (result,) = await unless_disconnected(raw, beam_search_all(ctx, request_id, [prompt], params.max_tokens,
                                                                   req.beam_search_params))
        return JSONResponse(_Chat(ctx, req, request_id, prompt).beam_response(result))
    try:
        streams = await add_all_naming(ctx, req._constraint_field, request_id, [prompt], params, req.language)
    except CinqError as e:  # the engine says max_tokens whichever field the client used
        raise rename_max_tokens(e, req.max_tokens_field) from None
    job = _Chat(ctx, req, request_id, prompt)
    if req.stream:
        return SSEResponse(job.stream(streams), streams, ctx.release)
    try:
        (out,) = await unless_disconnected(raw, final_outputs(streams))
    finally:
        ctx.release(streams)
    return JSONResponse(job.response(out))


class _Chat:
    def __init__(self, ctx: ServerContext, req: ChatCompletionRequest, request_id: str, prompt: Prompt) -> None:
        self.ctx, self.req, self.id, self.prompt = ctx, req, request_id, prompt
        self.created = int(time.time())

    def _logprobs(self, comp: CompletionOutput) -> dict | None:
        if not self.req.logprobs or comp.logprobs is None:
            return None
        return chat_logprobs(self.ctx.llm.tokenizer, comp.token_ids, comp.logprobs, self.req.top_logprobs or 0,
                             bool(self.req.return_tokens_as_token_ids))

    def _usage(self, completion_tokens: int) -> dict:
        n = len(self.prompt.token_ids)
        return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}

    def _message(self, comp: CompletionOutput) -> tuple[dict, str | None]:
        """The reply's message (tool calls parsed out when tools were offered) and its finish reason."""
        plan, echoed = self.req._tool_plan, self.req.echoed
        if plan is None or plan.choice == "none":
            return {"role": "assistant", "content": echoed + comp.text}, comp.finish_reason
        content, calls = plan.parse(comp.text)
        if echoed:
            content = echoed + (content or "")
        if not calls:
            return {"role": "assistant", "content": content}, comp.finish_reason
        finish = "tool_calls" if comp.finish_reason == "stop" else comp.finish_reason
        return {"role": "assistant", "content": content, "tool_calls": calls}, finish

    def response(self, out: RequestOutput) -> dict:
        comps = out.outputs
        choices = []
        for c in comps:
            message, finish = self._message(c)
            choices.append({"index": c.index, "message": message, "logprobs": self._logprobs(c),
                            "finish_reason": finish, "stop_reason": c.stop_reason})
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.ctx.model_name,
                "choices": choices, "usage": self._usage(sum(len(c.token_ids) for c in comps)),
                "system_fingerprint": None, **self._prompt_logprobs(out)}

    def beam_response(self, result: tuple[list[BeamSearchSequence], int]) -> dict:
        """The ``n`` best beams as the ``n`` choices, best first."""
        beams, _ = result
        choices = [{"index": i, "message": {"role": "assistant", "content": self.req.echoed + (beam.text or "")},
                    "logprobs": None,
                    "finish_reason": beam.finish_reason, "stop_reason": None} for i, beam in enumerate(beams)]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.ctx.model_name,
                "choices": choices, "usage": beam_usage([result]), "system_fingerprint": None}

    def _prompt_logprobs(self, out: RequestOutput) -> dict:
        """vLLM's top-level ``prompt_logprobs`` of a chat response, when asked for."""
        if self.req.prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": prompt_logprobs(self.ctx.llm.tokenizer, out.prompt_token_ids,
                                                   out.prompt_logprobs or [], self.req.prompt_logprobs)}

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.ctx.model_name, "choices": choices, "system_fingerprint": None}
        if self.req.include_usage:
            chunk["usage"] = usage
        return chunk

    def _tool_deltas(self, streamer: ToolCallStreamer, comp: CompletionOutput) -> list[dict]:
        """One choice's chunk entries when tools were offered: content or tool_calls fragments (held while a
        tool call may be forming), the finish reason "tool_calls" when one was made."""
        deltas = streamer.feed(comp.text, comp.finish_reason is not None)
        finish = comp.finish_reason
        if finish == "stop" and streamer.called:
            finish = "tool_calls"
        entries = [{"index": comp.index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas]
        if entries:
            entries[0]["logprobs"] = self._logprobs(comp)
        if finish is not None:
            if not entries:
                entries.append({"index": comp.index, "delta": {}, "logprobs": None, "finish_reason": None})
            entries[-1].update(finish_reason=finish, stop_reason=comp.stop_reason)
        return entries

    async def stream(self, streams: list[RequestStream]) -> AsyncIterator[str]:
        generated = 0
        plan = self.req._tool_plan
        tools = {i: ToolCallStreamer(plan) for i in range(self.req.n)} if plan and plan.choice != "none" else None
        continuous = bool(self.req.stream_options and self.req.stream_options.continuous_usage_stats)
        try:
            # The role comes first, one chunk per choice, as OpenAI sends it.
            for i in range(self.req.n):
                yield sse(self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]))
            if self.req.echoed:  # then the echoed final message, as vLLM sends it
                for i in range(self.req.n):
                    yield sse(self._chunk([{"index": i, "delta": {"content": self.req.echoed}, "logprobs": None,
                                            "finish_reason": None}]))
            async for _, out in merge_streams(streams):
                choices = []
                for comp in out.outputs:
                    generated += len(comp.token_ids)
                    if not (comp.text or comp.finish_reason or (self.req.logprobs and comp.token_ids)):
                        continue  # tokens held back (partial character, possible stop string)
                    if tools is not None:  # one chunk per delta: a header and its arguments never share one
                        for entry in self._tool_deltas(tools[comp.index], comp):
                            yield sse(self._chunk([entry], self._usage(generated) if continuous else None))
                        continue
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
