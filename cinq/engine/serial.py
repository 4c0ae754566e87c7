"""The wire format between a front end and an engine core in another process: two ZMQ frames per message, a
one-byte kind and a msgpack body (msgspec, decoded straight into the plain dataclasses of ``engine/io.py``).

    front end -> core   ADD [EngineCoreRequest] (a request's n sequences together), ABORT CoreAbort, SHUTDOWN
    core -> front end   READY EngineCoreInfo (once), STARTUP_ERROR CoreError (instead, then the core exits),
                        OUTPUTS EngineCoreOutputs (every step, and now and then when idle, for fresh stats)
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from cinq.engine.io import EngineCoreInfo, EngineCoreOutputs, EngineCoreRequest
from cinq.errors import CinqError, InvalidParameterError, ModelLoadError, PromptTooLongError

ADD, ABORT, SHUTDOWN = b"A", b"X", b"S"
READY, STARTUP_ERROR, OUTPUTS = b"R", b"E", b"O"


@dataclass(slots=True)
class CoreAbort:
    """End these sequences; ``status``: a finished ``RequestStatus`` value ("abort", "stop", "error")."""

    request_ids: list[str]
    status: str = "abort"


@dataclass(slots=True)
class CoreError:
    """An exception that stopped the core from starting, to be raised again on the front end's side."""

    type_name: str
    message: str
    param: str | None = None


# Errors raised again as themselves: the user sees the original one-line error (a bad model folder is a
# ModelLoadError naming the file, not a timeout). Anything else becomes a RuntimeError naming its type.
_CINQ_ERRORS: dict[str, type[CinqError]] = {c.__name__: c for c in
                                            (CinqError, InvalidParameterError, ModelLoadError, PromptTooLongError)}


def error_to_wire(error: BaseException) -> CoreError:
    return CoreError(type(error).__name__, str(error), getattr(error, "param", None))


def error_from_wire(error: CoreError) -> BaseException:
    cls = _CINQ_ERRORS.get(error.type_name)
    if cls is not None:
        return cls(error.message, error.param)
    return RuntimeError(f"{error.type_name}: {error.message}")


_encoder = msgspec.msgpack.Encoder()
_decoders = {
    ADD: msgspec.msgpack.Decoder(list[EngineCoreRequest]),
    ABORT: msgspec.msgpack.Decoder(CoreAbort),
    SHUTDOWN: None,
    READY: msgspec.msgpack.Decoder(EngineCoreInfo),
    STARTUP_ERROR: msgspec.msgpack.Decoder(CoreError),
    OUTPUTS: msgspec.msgpack.Decoder(EngineCoreOutputs),
}


def encode(kind: bytes, body: object = None) -> list[bytes]:
    """The frames of one message."""
    return [kind, _encoder.encode(body)]


def decode(frames: list[bytes]) -> tuple[bytes, object]:
    """(kind, body) of one message; raises ``ValueError`` on a malformed one."""
    if len(frames) != 2 or frames[0] not in _decoders:
        raise ValueError(f"malformed engine-core message: {[bytes(f[:16]) for f in frames]!r}")
    kind, decoder = frames[0], _decoders[frames[0]]
    return kind, (None if decoder is None else decoder.decode(frames[1]))
