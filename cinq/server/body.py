"""Reading a request body into a JSON object that every later layer can trust: within the size limit, strict JSON
(no ``NaN``/``Infinity``; integral numbers as ints), an object at the top, and only strings that UTF-8 can hold.

The last check is the general guard against "valid JSON, invalid text": JSON may spell a lone UTF-16 surrogate
(``"\\ud800"``), Python decodes it into a ``str`` that no encoder accepts, and the tokenizer, the chat template or
a log line would fail on it later with a 500. Checking every string (keys included) once, here, covers every
field of every route, including ones added later and ones passed through untyped (``chat_template_kwargs``).
"""

from __future__ import annotations

import json
import re

from starlette.requests import Request

from cinq.server.errors import APIError

MAX_BODY_BYTES = 64 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")
# Only an escape can produce a surrogate (raw surrogate bytes are not UTF-8, so json.loads refuses them), and
# JSON escapes spell it \uD800-\uDFFF: a body without "\ud"/"\uD" needs no walk.
_ESCAPE_MARKERS = (b"\\ud", b"\\uD")


async def read_json_object(raw: Request) -> dict:
    """The body as a dict; raises ``APIError`` (413 too large, 400 otherwise) naming what is wrong."""
    length = raw.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise APIError(413, f"request body is {length} bytes; the limit is {MAX_BODY_BYTES}", None, "too_large")
    body = await raw.body()
    if len(body) > MAX_BODY_BYTES:
        raise APIError(413, f"request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES}", None, "too_large")
    try:
        data = json.loads(body, parse_constant=_refuse_constant, parse_float=_number)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"Invalid JSON body: {e}", None, "invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}", None,
                       "invalid_json")
    if any(m in body for m in _ESCAPE_MARKERS):
        check_unicode(data)
    return data


def _number(text: str) -> int | float:
    """JSON has one number type: ``45.0`` is the integer 45 (JSON Schema says so too, and clients and fuzzers
    that build bodies from a schema send it), so integral values parse as ``int`` for the strict int fields;
    float fields accept ints. ``2.5`` stays a float and an integer field refuses it."""
    value = float(text)
    return int(value) if value.is_integer() else value


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def check_unicode(data: object) -> None:
    """Raise a 400 naming the first string (value or key) that holds a lone surrogate, as a field path such as
    ``messages[0].content``; ``param`` is its top-level field, as OpenAI reports it (None for a top-level key)."""
    stack: list[tuple[object, tuple]] = [(data, ())]
    while stack:  # iterative: a deep body must not hit the recursion limit here
        value, path = stack.pop()
        if isinstance(value, str):
            _check_string(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_string(key, path, key_of=True)
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))


def _format(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _check_string(text: str, path: tuple, key_of: bool = False) -> None:
    m = _SURROGATE.search(text)
    if m is None:
        return
    where = (f"a key of {_format(path)}" if path else "a top-level key") if key_of else _format(path)
    param = path[0] if path else None
    raise APIError(400, f"{where}: the string holds a lone UTF-16 surrogate (U+{ord(m.group()):04X}) at "
                        f"character {m.start()}; text must be valid Unicode", param, "invalid_unicode")
