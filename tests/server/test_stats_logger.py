"""The periodic stats log of `cinq serve` (vLLM's "Avg prompt throughput: ..." line): rates over the interval,
quiet when idle, on for a live server under load, and its flags."""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import time

import httpx
import pytest

from cinq.outputs import EngineStats
from cinq.server.stats_logger import StatsLogger
from tests.server.harness import MODEL_NAME, serve

LINE = re.compile(r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
                  r"Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: ([\d.]+)%, "
                  r"Prefix cache hit rate: ([\d.]+)%")
LOGGER = "cinq.server.stats_logger"


class FakeEngine:
    """Stats and their time, set by the test."""

    def __init__(self) -> None:
        self.stats, self.time = EngineStats(), 100.0

    def advance(self, seconds: float, **changes: object) -> None:
        self.time += seconds
        self.stats = dataclasses.replace(self.stats, **changes)


@pytest.fixture
def fake():
    return FakeEngine()


def make_logger(fake: FakeEngine, interval: float = 5.0) -> StatsLogger:
    return StatsLogger(lambda: fake.stats, lambda: fake.time, interval)


def records(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


def test_rates_are_over_the_interval_between_snapshots(fake, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    logger = make_logger(fake)
    fake.advance(4.0, prompt_tokens=400, generation_tokens=100, num_running=3, num_waiting=2, kv_cache_usage=0.25,
                 prefix_cache_queries=400, prefix_cache_hits=100)
    line = logger.log_once()
    assert line == ("Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 25.0 tokens/s, Running: 3 "
                    "reqs, Waiting: 2 reqs, GPU KV cache usage: 25.0%, Prefix cache hit rate: 25.0%")
    fake.advance(2.0, generation_tokens=160)  # 60 more in 2 s; no new prompt tokens
    g = LINE.search(logger.log_once()).groups()
    assert (float(g[0]), float(g[1])) == (0.0, 30.0)
    assert [level for level, _ in records(caplog)] == [logging.INFO, logging.INFO]


def test_idle_is_quiet_after_one_closing_line(fake, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    logger = make_logger(fake)
    logger.log_once()  # idle from the start: DEBUG only
    fake.advance(5.0, generation_tokens=50, num_running=1)
    logger.log_once()  # busy
    fake.advance(5.0, num_running=0)
    logger.log_once()  # the load ended: shown once at INFO (throughput 0)
    fake.advance(5.0)
    logger.log_once()  # still idle: DEBUG
    levels = [level for level, _ in records(caplog)]
    assert levels == [logging.DEBUG, logging.INFO, logging.INFO, logging.DEBUG]
    assert "Avg generation throughput: 0.0 tokens/s" in records(caplog)[2][1]


def test_waiting_requests_count_as_load_without_throughput(fake, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    logger = make_logger(fake)
    fake.advance(5.0, num_waiting=7)  # e.g. stuck behind a full KV cache
    logger.log_once()
    assert len(records(caplog)) == 1 and "Waiting: 7 reqs" in records(caplog)[0][1]


def test_no_fresh_snapshot_keeps_the_baseline(fake):
    logger = make_logger(fake)
    fake.stats = dataclasses.replace(fake.stats, generation_tokens=10)  # same time: the engine has not republished
    assert "Avg generation throughput: 0.0" in logger.log_once()
    fake.advance(2.0, generation_tokens=30)
    assert "Avg generation throughput: 15.0" in logger.log_once()  # 30 tokens since the baseline, over 2 s


def test_spec_decoding_line_covers_the_interval(fake, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake.stats = EngineStats(spec_decode_num_drafts=10, spec_decode_num_draft_tokens=30,
                             spec_decode_num_accepted_tokens=15, spec_decode_num_accepted_tokens_per_pos=[8, 5, 2])
    logger = make_logger(fake)
    fake.advance(1.0, generation_tokens=40, num_running=1, spec_decode_num_drafts=20,
                 spec_decode_num_draft_tokens=60, spec_decode_num_accepted_tokens=35,
                 spec_decode_num_accepted_tokens_per_pos=[18, 12, 5])
    logger.log_once()
    spec = [m for _, m in records(caplog) if m.startswith("SpecDecoding")]
    # 10 drafts of 3 tokens in the interval, 20 accepted: tau 3.00, per position 10/10, 7/10, 3/10
    assert spec == ["SpecDecoding metrics: Mean acceptance length: 3.00, Accepted: 20 tokens, Drafted: 30 tokens, "
                    "Per-position acceptance rate: 1.000, 0.700, 0.300, Avg Draft acceptance rate: 66.7%"]


def test_interval_must_be_positive(fake):
    with pytest.raises(ValueError):
        make_logger(fake, interval=0)


def test_live_server_logs_its_load(tiny_llama, caplog, monkeypatch):
    """The logger starts with the app, reports the tokens a real request generated, and stops with it."""
    import cinq.server.app as app_module
    caplog.set_level(logging.INFO, logger=LOGGER)
    monkeypatch.setattr(app_module, "build_app", functools.partial(app_module.build_app, log_stats_interval=0.2))
    with serve(tiny_llama) as s:
        r = httpx.post(s.api + "/completions", timeout=60, json={
            "model": MODEL_NAME, "prompt": "hello there", "max_tokens": 48, "ignore_eos": True, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 48
        deadline = time.monotonic() + 10
        while not any(float(LINE.search(m).group(2)) > 0 for _, m in records(caplog)):
            assert time.monotonic() < deadline, records(caplog)
            time.sleep(0.05)
        time.sleep(1.0)  # five more intervals, all idle
    stopped = len(records(caplog))
    time.sleep(0.5)
    assert len(records(caplog)) == stopped  # the task ended with the app
    groups = [LINE.search(m).groups() for _, m in records(caplog)]
    # an idle server does not keep logging: at most one (zero-throughput) line after the last one under load
    last_busy = max(i for i, g in enumerate(groups) if float(g[0]) or float(g[1]) or int(g[2]) or int(g[3]))
    assert len(groups) - 1 - last_busy <= 1, records(caplog)


def test_serve_flags():
    from cinq.cli import build_parser
    from cinq.commands.serve import stats_interval
    from cinq.errors import InvalidParameterError
    parse = build_parser().parse_args
    assert stats_interval(parse(["serve"])) == 5.0
    assert stats_interval(parse(["serve", "--log-stats-interval", "0.5"])) == 0.5
    assert stats_interval(parse(["serve", "--log-stats-interval", "0"])) == 0.0
    assert stats_interval(parse(["serve", "--log-stats-interval", "2", "--disable-log-stats"])) == 0.0
    with pytest.raises(InvalidParameterError):
        stats_interval(parse(["serve", "--log-stats-interval", "-1"]))
