"""Errors in the user's words: the option classes the commands fill (``ThroughputOptions``, ``SearchSpace``, ...)
name their own fields ("num_requests must be an integer >= 1") or another command's flag ("--variants: unknown
method"), while the user typed ``--num-prompts`` or ``--quant``. ``naming_flags`` re-raises such an error with the
flag the field came from."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from cinq.errors import CinqError


def parser_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> its flag's long spelling, for every flag of ``parser`` (a field named like its flag's dest needs no
    entry of its own in ``naming_flags``)."""
    return {a.dest: max(a.option_strings, key=len) for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)}


def with_flag(message: str, param: str, flag: str) -> str:
    """``message`` (about field ``param``) led by ``flag`` in place of the field's or another flag's name."""
    for said in (f"--{param.replace('_', '-')}", param):
        rest = message[len(said):]
        if message.startswith(said) and (rest.startswith(":") or rest.startswith(" must ")):
            return flag + rest
    return message if flag in message else f"{flag}: {message}"


@contextmanager
def naming_flags(flags: Mapping[str, str]) -> Iterator[None]:
    """Within: a CinqError (InvalidParameterError, ModelLoadError, ...) whose ``param`` is in ``flags`` (field ->
    flag) is raised again, of the same class and param, naming the flag; any other passes unchanged."""
    try:
        yield
    except CinqError as e:
        flag = flags.get(e.param or "")
        if flag is None:
            raise
        raise type(e)(with_flag(str(e), e.param or "", flag), e.param) from None
