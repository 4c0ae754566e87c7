"""The server's periodic engine log line, vLLM's ``LoggingStatLogger``: every few seconds, while there is load,

    Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 95.0 tokens/s, Running: 4 reqs,
    Waiting: 0 reqs, GPU KV cache usage: 12.5%, Prefix cache hit rate: 40.2%

(one line; vLLM's wording, "GPU" included whatever the device, so that log scrapers written for vLLM read it),
plus vLLM's "SpecDecoding metrics" line when the server speculates. Throughputs are over the interval since the
previous line; the prefix cache hit rate is since start, as in ``/stats``. An idle server logs nothing at INFO
(the line goes to DEBUG, as vLLM does "to avoid log noise on an idle production system"); the first idle
interval after a busy one still logs its zero throughput, so the log shows the load ending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from cinq.outputs import EngineStats, mean_acceptance_length

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0  # vLLM's VLLM_LOG_STATS_INTERVAL default (10 s there; 5 s reads better on small models)


class StatsLogger:
    """Logs the engine's throughput, queue and cache state every ``interval`` seconds (``start()`` on the event
    loop, ``await stop()``); ``log_once()`` is one tick, for tests and callers with their own clock.

    ``get_stats`` returns the engine's stats and ``get_time`` the time they were taken (``AsyncLLM.get_stats`` and
    ``AsyncLLM.stats_time``: the engine thread publishes them after every step), so a rate divides counters by
    the time between the two snapshots they come from, not by when this logger happened to wake."""

    def __init__(self, get_stats: Callable[[], EngineStats], get_time: Callable[[], float],
                 interval: float = DEFAULT_INTERVAL_S, logger: logging.Logger = log) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.interval = interval
        self._get_stats = get_stats
        self._get_time = get_time
        self._log = logger
        self._last = get_stats()
        self._last_time = get_time()
        self._was_busy = False
        self._task: asyncio.Task | None = None

    def log_once(self) -> str:
        """Log the line for the interval since the previous call (INFO under load, else DEBUG); returns it."""
        now, stats = self._get_time(), self._get_stats()
        prev, elapsed = self._last, now - self._last_time
        if elapsed <= 0:  # no fresh snapshot since the last line (a long step): nothing to divide by yet
            elapsed = 0.0
        prompt_tokens = stats.prompt_tokens - prev.prompt_tokens
        generation_tokens = stats.generation_tokens - prev.generation_tokens
        busy = bool(prompt_tokens or generation_tokens or stats.num_running or stats.num_waiting)
        level = logging.INFO if busy or self._was_busy else logging.DEBUG
        line = (f"Avg prompt throughput: {_rate(prompt_tokens, elapsed):.1f} tokens/s, "
                f"Avg generation throughput: {_rate(generation_tokens, elapsed):.1f} tokens/s, "
                f"Running: {stats.num_running} reqs, Waiting: {stats.num_waiting} reqs, "
                f"GPU KV cache usage: {100 * stats.kv_cache_usage:.1f}%, "
                f"Prefix cache hit rate: {100 * stats.prefix_cache_hit_rate:.1f}%")
        self._log.log(level, "%s", line)
        spec = spec_decoding_line(prev, stats)
        if spec is not None:
            self._log.log(level, "%s", spec)
        if elapsed > 0:  # keep the older baseline until a fresh snapshot arrives
            self._last, self._last_time = stats, now
        self._was_busy = busy
        return line

    def start(self) -> None:
        """Start logging in a task on the running event loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="cinq-stats-logger")

    async def stop(self) -> None:
        """Cancel the task and wait for it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.log_once()
            except Exception:  # a logging bug must not end the server's log for good
                self._log.exception("stats logging failed")


def spec_decoding_line(prev: EngineStats, stats: EngineStats) -> str | None:
    """vLLM's speculative-decoding log line for the drafts verified between two snapshots; None without any."""
    drafts = stats.spec_decode_num_drafts - prev.spec_decode_num_drafts
    if drafts <= 0:
        return None
    drafted = stats.spec_decode_num_draft_tokens - prev.spec_decode_num_draft_tokens
    accepted = stats.spec_decode_num_accepted_tokens - prev.spec_decode_num_accepted_tokens
    before = prev.spec_decode_num_accepted_tokens_per_pos
    per_pos = [n - (before[i] if i < len(before) else 0)
               for i, n in enumerate(stats.spec_decode_num_accepted_tokens_per_pos)]
    rates = ", ".join(f"{n / drafts:.3f}" for n in per_pos)
    return (f"SpecDecoding metrics: Mean acceptance length: {mean_acceptance_length(accepted, drafts):.2f}, "
            f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {rates}, "
            f"Avg Draft acceptance rate: {100 * accepted / drafted if drafted else 0.0:.1f}%")


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0
