"""A chat template given at start-up (vLLM's ``--chat-template``): a file's path or the jinja2 text itself, in place
of the one in the model's tokenizer config; for a base model that has none, or to try another. vLLM's reading:
a value holding a jinja character (``{``, ``}`` or a newline) is the template inline, anything else is a path."""

from __future__ import annotations

from pathlib import Path

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
