"""``use_beam_search`` on /v1/completions and /v1/chat/completions (vLLM's extra): engine/beam_search.py driven over
the server's engine, every live beam a one-token request per step (the prefix cache keeps each resend to about its
last block); the ``n`` best beams are the ``n`` choices, best first. Each step's requests count in /metrics as the
engine's requests do in vLLM's beam search."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cinq.engine.beam_search import BeamSearch, BeamSearchParams, BeamSearchSequence
from cinq.errors import PromptTooLongError
from cinq.server.context import Prompt, ServerContext
from cinq.server.streams import final_outputs


def beam_max_tokens(max_tokens: int | None, prompt: Prompt, max_model_len: int) -> int:
    """The steps a search may take: ``max_tokens`` (None: up to the context), refused past the context as a sampled
    request is."""
    n = len(prompt.token_ids)
    steps = max_model_len - n if max_tokens is None else max_tokens
    if steps < 1 or n + steps > max_model_len:
        raise PromptTooLongError(f"This model's maximum context length is {max_model_len} tokens. However, you "
                                 f"requested {n + steps} tokens ({n} in the prompt, {steps} for the completion). "
                                 "Please reduce the prompt or max_tokens.", "max_tokens")
    return steps


async def beam_search(ctx: ServerContext, request_id: str, prompt: Prompt, params: BeamSearchParams
                      ) -> tuple[list[BeamSearchSequence], int]:
    """The best ``params.beam_width`` beams of ``prompt`` (their ``text`` decoded) and the prompt's length."""
    tok = ctx.llm.tokenizer
    search = BeamSearch(prompt.token_ids, params, tok.eos_token_ids, ctx.llm.max_model_len)
    step = params.step_params()
    while not search.done:
        streams = await ctx.add_all(f"{request_id}-step{search.steps}", [Prompt(b.tokens, None) for b in search.live],
                                    step)
        try:
            search.advance(await final_outputs(streams))
        finally:
            ctx.release(streams)
    best = search.result()
    for beam in best:
        beam.text = tok.decode(search.generated(beam))
    return best, search.prompt_len


async def beam_search_all(ctx: ServerContext, request_id: str, prompts: list[Prompt], max_tokens: int | None,
                          params_for: Callable[[int], BeamSearchParams]
                          ) -> list[tuple[list[BeamSearchSequence], int]]:
    """Every prompt's search, side by side (one failing cancels the others); ``params_for(steps)`` builds the
    params once the prompt's steps are known."""
    params = [params_for(beam_max_tokens(max_tokens, p, ctx.llm.max_model_len)) for p in prompts]
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(beam_search(ctx, f"{request_id}-{i}", p, ps))
                 for i, (p, ps) in enumerate(zip(prompts, params))]
    return [t.result() for t in tasks]


def usage(results: list[tuple[list[BeamSearchSequence], int]]) -> dict:
    prompt_tokens = sum(n for _, n in results)
    completion = sum(len(b.logprobs) for beams, _ in results for b in beams)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
