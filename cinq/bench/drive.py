"""Driving an engine through a batch of queued requests until every one has finished."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm

    from cinq.engine.protocol import OfflineEngine
    from cinq.outputs import RequestOutput


def run_until_done(engine: OfflineEngine, bar: tqdm | None = None,
                   on_step: Callable[[OfflineEngine], None] | None = None) -> dict[str, RequestOutput]:
    """Step ``engine`` until it has no unfinished request; returns the final output of every request that
    finished meanwhile, by request id. ``bar`` advances by one per finished request; ``on_step`` is called after
    each step (to sample engine state, e.g. KV usage)."""
    finished: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
                if bar is not None:
                    bar.update(1)
        if on_step is not None:
            on_step(engine)
    return finished
