"""argparse types for flags that take a JSON object (``--speculative-config '{...}'``, ``--compilation-config``,
``cinq tune --spec-extra``, ``cinq bench stack --stack-speculative-config``).

A type that raises ValueError makes argparse print its own name ("invalid json_object value: '{method: ngram'")
and drop the reason; ArgumentTypeError's message is printed as it is, after the flag: "argument
--speculative-config: not a JSON object: Expecting property name enclosed in double quotes: line 1 column 2"."""

from __future__ import annotations

import argparse
import json
from typing import Any


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line; anything else is an ArgumentTypeError saying why."""
    value = _loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object ({{\"key\": value, ...}}), got {text!r}")
    return value


def json_object_or_null(text: str) -> dict[str, Any] | None:
    """As ``json_object``, but ``null`` is None (a flag whose 'null' switches something off)."""
    value = _loads(text)
    if value is not None and not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object or null, got {text!r}")
    return value


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not a JSON object: {e.msg}: line {e.lineno} column {e.colno}") from None
