"""Exceptions. Every user-facing error is a ``ValueError`` subclass whose message names the field and the limit;
the server maps them to OpenAI-style 4xx JSON errors."""

from __future__ import annotations


class CinqError(ValueError):
    """Base of cinq's input errors. ``param`` names the offending field when there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InvalidParameterError(CinqError):
    """A sampling or engine parameter is out of range or of the wrong type."""


class PromptTooLongError(CinqError):
    """The prompt (plus requested tokens) cannot fit the model context or the KV cache."""


class ModelLoadError(CinqError):
    """A model folder cannot be loaded: unsupported architecture, missing tensor, shape mismatch."""
