"""A conversation as prompt tokens: the model's chat template rendered (cinq/model/tokenizer.py), then tokenized.

With vLLM's ``continue_final_message`` the final message (usually the assistant's) is left open so that the model goes
on writing it (a "prefill"): the template is rendered without a generation prompt and the text is cut right after
that message's content, before whatever the template writes to close a turn. The cut is transformers'
``apply_chat_template(continue_final_message=True)``, which vLLM calls: the last occurrence of the content in the
rendered text, keeping trailing whitespace only where the template kept it. A final message with no text (vLLM
accepts it; transformers then keeps the whole rendered turn, end-of-turn included) is opened empty here instead: the
prompt ends where its content would begin, after the template's header for that role.
"""

from __future__ import annotations

from typing import Any

from cinq.errors import InvalidParameterError
from cinq.server.context import Prompt, ServerContext

FIELD = "continue_final_message"
# Stands in for a blank final message's content; private-use characters, which no template trims or escapes
_OPEN = "\ue000cinq-open\ue000"


def generation_flags(messages: list[Any], add_generation_prompt: bool, add_given: bool,
                     continue_final_message: bool) -> bool:
    """The ``add_generation_prompt`` to render with, after checking ``continue_final_message`` (a 400 naming it):
    the two cannot both be true (``add_generation_prompt`` defaults to true, so only an explicit true clashes, as
    vLLM checks the request body)."""
    if not continue_final_message:
        return add_generation_prompt
    if add_given and add_generation_prompt:
        raise InvalidParameterError("Cannot set both continue_final_message and add_generation_prompt to true",
                                    FIELD)
    return False  # any role's message may be continued, as in vLLM (usually the assistant's reply)


def cut_after_final_message(rendered: str, content: str) -> str:
    """``rendered`` (the whole conversation, no generation prompt) cut right after the final message's ``content``
    (non-blank); a 400 naming continue_final_message when the template did not write it out."""
    stripped = content.strip()
    at = rendered.rfind(stripped) if stripped else -1
    if at < 0:
        raise _not_rendered()
    # Where the template kept the message's trailing whitespace, keep it; where it trimmed it, cut at the text.
    kept = content.lstrip()
    end = at + len(kept) if rendered[at:at + len(kept)] == content else at + len(stripped)
    return rendered[:end]


def _not_rendered() -> InvalidParameterError:
    return InvalidParameterError("continue_final_message: the final message's content does not appear in the text "
                                 "the chat template renders, so it cannot be continued", FIELD)


async def render_chat_prompt(ctx: ServerContext, messages: list[dict[str, Any]], add_generation_prompt: bool,
                             template_kwargs: dict[str, Any] | None, continue_final_message: bool = False,
                             limit_param: str | None = None) -> Prompt:
    """Apply the chat template and tokenize (the template writes the special tokens itself). ``limit_param``: the
    field to name when the rendered text is too long for the context in any tokenization (``ServerContext.encode``)."""
    content = (messages[-1].get("content") or "") if continue_final_message and messages else ""
    opened = continue_final_message and messages and not content.strip()
    if opened:
        messages = [*messages[:-1], {**messages[-1], "content": _OPEN}]
    text = ctx.llm.tokenizer.apply_chat_template(messages, add_generation_prompt, **(template_kwargs or {}))
    if opened:
        at = text.rfind(_OPEN)
        if at < 0:
            raise _not_rendered()
        text = text[:at]
    elif continue_final_message:
        text = cut_after_final_message(text, content)
    return Prompt(await ctx.encode(text, add_special_tokens=False, limit_param=limit_param), text)
