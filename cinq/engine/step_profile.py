"""The target's decode-step cost as a function of the rows it computes, measured at start-up on dummy steps (as
vLLM profiles and captures its step shapes before serving): what adaptive speculation (cinq/spec/adaptive.py)
prices a verify step by, so that it need not try an arm to learn that verifying 64 rows costs twice 32.

A step of R rows is R one-token decodes in the runner's scratch blocks (the blocks that padding rows write and no
request owns), through the executor like any step: every rank runs it under tensor parallelism, and the runner's
wall time is what adaptive k measures of real steps. Their attention reads one block of context where a real
verify reads a request's; adaptive k scales the curve by what plain steps measure."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from cinq.sampling_params import SamplingParams
from cinq.step.scheduler_output import NewRequestData, ScheduledSeq, SchedulerOutput

if TYPE_CHECKING:
    from cinq.engine.executor import Executor

log = logging.getLogger(__name__)

PROFILE_ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # past the last, cost grows in proportion to rows
PROFILE_REPEATS = 2  # timed steps per row count (the fastest counts), after one untimed step that builds its shapes


def profile_rows(max_rows: int) -> list[int]:
    """The row counts profiled for steps of at most ``max_rows`` rows (the first count past it included: the
    curve then reaches every row count a step can have, or its proportional tail)."""
    rows = [r for r in PROFILE_ROWS if r < max_rows]
    nxt = next((r for r in PROFILE_ROWS if r >= max_rows), None)
    return rows + ([nxt] if nxt is not None else [])


def profile_decode_rows(executor: Executor, rows: list[int], block_ids: list[int],
                        group_block_ids: list[list[int]] | None = None) -> dict[int, float]:
    """Seconds of a decode step of each of ``rows`` one-token sequences (the fastest of ``PROFILE_REPEATS``, after
    one untimed), run through ``executor`` in the scratch blocks ``block_ids`` (``group_block_ids``: one per KV
    cache group). The dummy requests are dropped from the runner after each row count."""
    t0 = time.perf_counter()
    position = 0  # every dummy is token 0 at position 0: it writes slot 0 of the first scratch block, read by none
    params = SamplingParams(temperature=0.0, max_tokens=1)
    out: dict[int, float] = {}
    for n in rows:
        ids = [f"_profile-{n}-{i}" for i in range(n)]
        best = float("inf")
        for rep in range(PROFILE_REPEATS + 1):
            seqs = [ScheduledSeq(rid, [0], position, list(block_ids), 1, group_block_ids=group_block_ids)
                    for rid in ids]
            new = [NewRequestData(rid, [0], params) for rid in ids] if rep == 0 else []
            run = executor.execute_model(SchedulerOutput(seqs=seqs, new_requests=new, num_batched_tokens=n))
            if rep:
                best = min(best, run.elapsed_s)
        executor.execute_model(SchedulerOutput(finished_request_ids=ids))
        out[n] = best
    log.info("profiled the decode step at %s rows in %.1f s (%s)", rows, time.perf_counter() - t0,
             ", ".join(f"{n}: {1000 * s:.1f} ms" for n, s in out.items()))
    return out
