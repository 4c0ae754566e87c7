"""Ctrl-C between engine steps, for the commands that drive an ``LLMEngine`` themselves (generate, chat).

A KeyboardInterrupt raised inside ``LLMEngine.step()`` could leave the scheduler and the output processor out of
step with each other; these commands keep using the engine (chat) or print what it produced (generate), so the
first Ctrl-C only sets a flag that their loop reads after each step. A second Ctrl-C before the loop has seen
the first raises KeyboardInterrupt at once: a step that takes too long must still be interruptible.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType


class StepInterrupt:
    """``with StepInterrupt() as stop: ... if stop.requested: ...``; outside the main thread (where Python
    delivers signals) it installs nothing and Ctrl-C keeps its usual effect."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None
        self._installed = False

    def __enter__(self) -> StepInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._installed = False

    def clear(self) -> None:
        """Forget a handled Ctrl-C (the next one only sets the flag again)."""
        self.requested = False

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
