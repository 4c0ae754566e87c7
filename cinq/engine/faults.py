"""Fault injection for tests: make one request's processing raise inside a live engine.

The engine isolates such failures (``LLMEngine.step``): the request ends alone with finish_reason ``"error"``,
its blocks are freed and the other requests go on. Tests need a way to cause one without patching engine
internals by hand:

    from cinq.engine.faults import inject_fault
    remove = inject_fault(engine, "detokenize", lambda rid, prompt: prompt[:2] == [7, 7])
    ...                                    # requests whose prompt starts with 7, 7 fail on their first token
    remove()

Production code pays nothing: nothing in the engine checks for faults. ``inject_fault`` wraps, on this one engine
instance only, the method the site runs through (``OutputProcessor.add_request`` to plant a failing
detokenizer; ``Scheduler._check_stop``), and ``remove()`` deletes the wrappers again. ``inject_step_fault`` makes
a whole step raise (the batched forward pass) while a matching request is in it.

For an engine core in its own process, pass the injection as ``AsyncMPLLM(..., on_core_start=...)``: a picklable
callable run on the core there, e.g. ``functools.partial(inject_fault, site="stop_check",
match=PromptStartsWith((7, 7)))`` (the "stop_check" and "step" sites live in the core; "detokenize" in the front
end).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cinq.engine.core import EngineCore
    from cinq.engine.engine import LLMEngine

SITES = ("detokenize", "stop_check")
# (request id, prompt token ids) -> whether this request gets the fault. For n > 1 the stop check sees each
# child's id ("{i}_{id}"); the detokenizer fault sees the parent id and fails every child.
Match = Callable[[str, list[int]], bool]


class InjectedFault(RuntimeError):
    """The error an injected fault raises."""


class _FailingDetokenizer:
    """Wraps a request's detokenizer: raises once it has been fed ``after_tokens`` tokens."""

    def __init__(self, inner: Any, after_tokens: int, site: str) -> None:
        self._inner, self._left, self._site = inner, after_tokens, site

    def update(self, new_token_ids: list[int]) -> str | None:
        self._left -= len(new_token_ids)
        if self._left < 0:
            raise InjectedFault(f"injected {self._site} fault")
        return self._inner.update(new_token_ids)

    def __getattr__(self, name: str) -> Any:  # output_text, visible_text, ...: the real detokenizer's
        return getattr(self._inner, name)


@dataclass(frozen=True, slots=True)
class PromptStartsWith:
    """A picklable ``Match`` (it can travel to a core process): prompts that start with ``prefix``."""

    prefix: tuple[int, ...]

    def __call__(self, _request_id: str, prompt: list[int]) -> bool:
        return tuple(prompt[:len(self.prefix)]) == self.prefix


def inject_step_fault(core: EngineCore | LLMEngine, match: Match) -> Callable[[], None]:
    """Make every step that computes a request selected by ``match`` raise ``InjectedFault`` from the executor
    (as a failing forward pass would). Returns a function that removes the fault."""
    executor = core.executor
    requests = core.scheduler.requests
    real_execute = executor.execute_model

    def execute_model(sched: Any) -> Any:
        for seq in sched.seqs:
            req = requests.get(seq.request_id)
            if req is not None and match(seq.request_id, req.prompt_token_ids):
                raise InjectedFault("injected step fault")
        return real_execute(sched)

    executor.execute_model = execute_model  # type: ignore[method-assign]
    return lambda: executor.__dict__.pop("execute_model", None)


def inject_fault(engine: LLMEngine | EngineCore, site: str, match: Match, after_tokens: int = 0) -> Callable[[], None]:
    """Make requests selected by ``match`` raise ``InjectedFault`` at ``site`` once they have ``after_tokens``
    output tokens behind them. Returns a function that removes the fault (requests already planted with a
    failing detokenizer keep it)."""
    if site not in SITES:
        raise ValueError(f"site must be one of {', '.join(SITES)}; got {site!r}")
    if after_tokens < 0:
        raise ValueError(f"after_tokens must be >= 0, got {after_tokens}")
    if site == "detokenize":
        processor = engine.output_processor
        real_add = processor.add_request

        def add_request(request_id: str, prompt: str | None, prompt_token_ids: list[int], *args: Any,
                        **kwargs: Any) -> None:
            real_add(request_id, prompt, prompt_token_ids, *args, **kwargs)
            if match(request_id, prompt_token_ids):
                for comp in processor.parents[request_id].completions:
                    comp.detok = _FailingDetokenizer(comp.detok, after_tokens, site)  # type: ignore[assignment]

        processor.add_request = add_request  # type: ignore[method-assign]
        return lambda: processor.__dict__.pop("add_request", None)
    scheduler = engine.scheduler
    real_check = scheduler._check_stop

    def check_stop(req: Any, token: int) -> Any:
        if req.num_output_tokens > after_tokens and match(req.request_id, req.prompt_token_ids):
            raise InjectedFault(f"injected {site} fault")
        return real_check(req, token)

    scheduler._check_stop = check_stop  # type: ignore[method-assign]
    return lambda: scheduler.__dict__.pop("_check_stop", None)
