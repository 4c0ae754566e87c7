"""Chat templates: one given at start-up (vLLM's ``--chat-template``: a file's path or the jinja2 text itself, in
place of the one in the model's tokenizer config; for a base model that has none, or to try another; vLLM's reading:
a value holding a jinja character, ``{``, ``}`` or a newline, is the template inline, anything else a path), and a
conversation rendered with the tokenizer's, for the server and ``LLM.chat`` alike.

With vLLM's ``continue_final_message`` the final message (usually the assistant's) is left open so that the model goes
on writing it (a "prefill"): the template is rendered without a generation prompt and the text is cut right after
that message's content, before whatever the template writes to close a turn. The cut is transformers'
``apply_chat_template(continue_final_message=True)``, which vLLM calls: the last occurrence of the content in the
rendered text, keeping trailing whitespace only where the template kept it. A final message with no text (vLLM
accepts it; transformers then keeps the whole rendered turn, end-of-turn included) is opened empty here instead: the
prompt ends where its content would begin, after the template's header for that role.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cinq.errors import InvalidParameterError

FIELD = "chat_template"
_JINJA_CHARS = "{}\n"
MAX_TEMPLATE_BYTES = 1 << 20  # the largest templates in the wild (tool-calling ones) are ~20 KB


def load_chat_template(value: str) -> str:
    """The template text ``value`` gives (inline, or read from the file it names); an error naming
    ``chat_template`` when it is neither a readable file nor a template."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameterError(f"chat_template must be a file path or a jinja2 template, got {value!r:.60}",
                                    FIELD)
    if any(c in value for c in _JINJA_CHARS):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise InvalidParameterError(f"chat_template: {value!r} is not a file (give a template file's path, or the "
                                    "template itself inline)", FIELD)
    if path.stat().st_size > MAX_TEMPLATE_BYTES:
        raise InvalidParameterError(f"chat_template: {value!r} is larger than {MAX_TEMPLATE_BYTES} bytes", FIELD)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidParameterError(f"chat_template: cannot read {value!r}: {e}", FIELD) from e


CONTINUE_FIELD = "continue_final_message"
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
                                    CONTINUE_FIELD)
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
                                 "the chat template renders, so it cannot be continued", CONTINUE_FIELD)


def render_conversation(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                        continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None) -> str:
    """``messages`` as the text the model reads: ``tokenizer``'s chat template applied, the final message left open
    under ``continue_final_message`` (then ``add_generation_prompt`` must be false: ``generation_flags``)."""
    content = (messages[-1].get("content") or "") if continue_final_message and messages else ""
    opened = continue_final_message and messages and not content.strip()
    if opened:
        messages = [*messages[:-1], {**messages[-1], "content": _OPEN}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt, **(template_kwargs or {}))
    if opened:
        at = text.rfind(_OPEN)
        if at < 0:
            raise _not_rendered()
        return text[:at]
    return cut_after_final_message(text, content) if continue_final_message else text
