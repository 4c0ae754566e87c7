"""A conversation as prompt tokens for the server's routes: rendered by the chat template (model/chat_template.py,
``continue_final_message`` included), then tokenized off the event loop with the context bound checked."""

from __future__ import annotations

from typing import Any

from cinq.model.chat_template import render_conversation
from cinq.server.context import Prompt, ServerContext


async def render_chat_prompt(ctx: ServerContext, messages: list[dict[str, Any]], add_generation_prompt: bool,
                             template_kwargs: dict[str, Any] | None, continue_final_message: bool = False,
                             limit_param: str | None = None) -> Prompt:
    """Apply the chat template and tokenize (the template writes the special tokens itself). ``limit_param``: the
    field to name when the rendered text is too long for the context in any tokenization (``ServerContext.encode``)."""
    text = render_conversation(ctx.llm.tokenizer, messages, add_generation_prompt, continue_final_message,
                               template_kwargs)
    return Prompt(await ctx.encode(text, add_special_tokens=False, limit_param=limit_param), text)
