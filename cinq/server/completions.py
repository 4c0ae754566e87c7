"""POST /v1/completions: prompts (text, token ids, or lists of either) -> completions, whole or streamed.

With ``echo`` the prompt is prepended to each choice's text and, with ``logprobs``, its token logprobs too;
``echo`` + ``max_tokens: 0`` + ``logprobs`` scores a prompt without generating, which is what
lm-evaluation-harness' loglikelihood requests do.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse
from starlette.requests import Request

from cinq.engine.async_engine import RequestStream
from cinq.outputs import CompletionOutput, RequestOutput
from cinq.engine.beam_search import BeamSearchSequence
from cinq.server.beam_search import beam_search_all
from cinq.server.beam_search import usage as beam_usage
from cinq.server.context import Prompt, ServerContext, new_id
from cinq.server.errors import to_api_error
from cinq.server.logprobs import CompletionLogprobs, prompt_logprobs
from cinq.server.structured import add_all_naming
from cinq.server.protocol import CompletionRequest
from cinq.server.streams import DONE, SSEResponse, final_outputs, merge_streams, sse, unless_disconnected


async def create_completion(ctx: ServerContext, req: CompletionRequest, raw: Request):
    ctx.check_model(req.model)
    params = req.to_sampling_params(ctx.llm.default_sampling_params)
    ctx.check_token_ids(params.stop_token_ids, "stop_token_ids")
    given = req.prompts()
    truncating = params.truncate_prompt_tokens is not None  # then a long prompt is cut, not refused
    for p in given:  # all of them before tokenizing any: a batch with one prompt too long is refused at once
        if isinstance(p, str) and not truncating:
            ctx.check_fits(p, "prompt")
    prompts = []
    for p in given:
        if isinstance(p, str):
            prompts.append(ctx.truncate(Prompt(await ctx.encode(p), p), params))
        else:
            ctx.check_token_ids(p, "prompt")
            prompts.append(ctx.truncate(Prompt(p, None), params))
    request_id = new_id("cmpl")
    if req.use_beam_search:
        results = await unless_disconnected(raw, beam_search_all(ctx, request_id, prompts, params.max_tokens,
                                                                 req.beam_search_params))
        job = _Completion(ctx, req, request_id, prompts)
        return JSONResponse(job.beam_response(results))
    streams = await add_all_naming(ctx, req._constraint_field, request_id, prompts, params, req.language)
    job = _Completion(ctx, req, request_id, prompts)
    if req.stream:
        return SSEResponse(job.stream(streams), streams, ctx.release)
    try:
        outputs = await unless_disconnected(raw, final_outputs(streams))
    finally:
        ctx.release(streams)
    return JSONResponse(job.response(outputs))


class _Completion:
    """Builds the response objects of one completions request (n choices per prompt)."""

    def __init__(self, ctx: ServerContext, req: CompletionRequest, request_id: str, prompts: list[Prompt]) -> None:
        self.ctx, self.req, self.id, self.prompts = ctx, req, request_id, prompts
        self.created = int(time.time())
        self.n = req.n

    def _builder(self) -> CompletionLogprobs:
        return CompletionLogprobs(self.ctx.llm.tokenizer, as_ids=bool(self.req.return_tokens_as_token_ids))

    def _echo_text(self, prompt: Prompt) -> str:
        return prompt.text if prompt.text is not None else self.ctx.llm.tokenizer.decode(prompt.token_ids)

    def _choice(self, index: int, text: str, logprobs: dict | None, comp: CompletionOutput | None) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs,
                "finish_reason": comp.finish_reason if comp else None,
                "stop_reason": comp.stop_reason if comp else None}

    def _logprobs(self, builder: CompletionLogprobs, out: RequestOutput, comp: CompletionOutput,
                  with_prompt: bool) -> dict | None:
        if self.req.logprobs is None:
            return None
        ids, positions = [], []
        if with_prompt and out.prompt_logprobs is not None:
            ids += out.prompt_token_ids
            positions += list(out.prompt_logprobs)
        ids += comp.token_ids
        positions += comp.logprobs or [None] * len(comp.token_ids)
        return builder.build(ids, positions, self.req.logprobs)

    def _usage(self, completion_tokens: int) -> dict:
        prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def response(self, outputs: list[RequestOutput]) -> dict:
        choices, generated = [], 0
        for i, (prompt, out) in enumerate(zip(self.prompts, outputs)):
            for comp in out.outputs:
                text = self._echo_text(prompt) + comp.text if self.req.echo else comp.text
                lp = self._logprobs(self._builder(), out, comp, self.req.echo)
                choice = self._choice(i * self.n + comp.index, text, lp, comp)
                if self.req.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs(self.ctx.llm.tokenizer, out.prompt_token_ids,
                                                                out.prompt_logprobs or [], self.req.prompt_logprobs)
                choices.append(choice)
                generated += len(comp.token_ids)
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.ctx.model_name,
                "choices": choices, "usage": self._usage(generated), "system_fingerprint": None}

    def beam_response(self, results: list[tuple[list[BeamSearchSequence], int]]) -> dict:
        """Each prompt's ``n`` best beams as its ``n`` choices, best first."""
        choices = [self._choice(i * self.n + j, beam.text or "", None, None) | {
                   "finish_reason": beam.finish_reason, "stop_reason": None}
                   for i, (beams, _) in enumerate(results) for j, beam in enumerate(beams)]
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.ctx.model_name,
                "choices": choices, "usage": beam_usage(results), "system_fingerprint": None}

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        chunk = {"id": self.id, "object": "text_completion", "created": self.created,
                 "model": self.ctx.model_name, "choices": choices}
        if self.req.include_usage:
            chunk["usage"] = usage
        return chunk

    async def stream(self, streams: list[RequestStream]) -> AsyncIterator[str]:
        started: set[int] = set()
        builders: dict[int, CompletionLogprobs] = {}
        generated: dict[int, int] = {}
        continuous = bool(self.req.stream_options and self.req.stream_options.continuous_usage_stats)
        try:
            async for i, out in merge_streams(streams):
                choices = []
                for comp in out.outputs:
                    index = i * self.n + comp.index
                    first = index not in started
                    started.add(index)
                    if index not in builders:  # one builder per choice for the whole stream
                        builders[index] = self._builder()
                    builder = builders[index]
                    text = comp.text
                    if first and self.req.echo:
                        echo = self._echo_text(self.prompts[i])
                        text = echo + text
                        if self.req.logprobs is None or out.prompt_logprobs is None:
                            builder.offset += len(echo)
                    generated[index] = generated.get(index, 0) + len(comp.token_ids)
                    if not (text or comp.finish_reason or comp.token_ids):
                        continue
                    # A chunk per step even when its text is held back (a partial character, a possible stop
                    # string), as vLLM does: clients that count chunks or time tokens see every step.
                    lp = self._logprobs(builder, out, comp, first and self.req.echo)
                    choices.append(self._choice(index, text, lp, comp if comp.finish_reason else None))
                if choices:
                    usage = self._usage(sum(generated.values())) if continuous else None
                    yield sse(self._chunk(choices, usage))
            if self.req.include_usage:
                yield sse(self._chunk([], self._usage(sum(generated.values()))))
        except Exception as e:  # after the 200 has gone out, errors travel in the stream
            yield sse(to_api_error(e).body())
        yield DONE
