"""One in-process run at a request rate: every request served in full, latency and KV figures measured."""

from __future__ import annotations

import math

import pytest

from cinq.bench.rate_run import arrival_offsets, build_engine, module_bytes, run_at_rate
from cinq.bench.workload import random_requests
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError


def test_arrivals_are_a_seeded_poisson_process_or_all_at_once():
    assert arrival_offsets(4, math.inf, 0) == [0.0] * 4
    a = arrival_offsets(50, 10.0, 1)
    assert a == arrival_offsets(50, 10.0, 1) and a != arrival_offsets(50, 10.0, 2)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    assert 2.0 < a[-1] < 10.0  # 49 gaps of mean 0.1 s


def test_module_bytes_counts_shared_tensors_once():
    import torch
    a = torch.nn.Linear(4, 4, bias=False)
    b = torch.nn.Linear(4, 4, bias=False)
    b.weight = a.weight
    assert module_bytes(a, b) == module_bytes(a) == 16 * 4


@pytest.mark.parametrize("rate", [math.inf, 50.0])
def test_run_serves_every_request_and_measures_it(tiny_llama, rate):
    engine = build_engine(EngineConfig(model=str(tiny_llama), dtype="float32", num_threads=1, max_model_len=128,
                                       seed=0))
    reqs = random_requests(5, engine.vocab_size, (20, 40), (2, 6), seed=0, low_token=10)
    run = run_at_rate(engine, reqs, rate)
    assert [len(o) for o in run.outputs] == [r.output_len for r in reqs]
    assert run.output_tokens == sum(r.output_len for r in reqs) and run.tok_s > 0
    assert 0 <= run.ttft_p50_ms <= run.ttft_p99_ms and 0 <= run.tpot_p50_ms <= run.tpot_p99_ms
    assert run.peak_kv_blocks >= 1 and run.peak_kv_bytes == run.peak_kv_blocks * run.kv_bytes_per_block
    assert 0 <= run.kv_waste < 1 and run.tau is None
    assert run.weight_bytes == module_bytes(engine.model)
    assert not engine.has_unfinished_requests()


def test_run_keeps_token_times_running_batch_and_given_arrivals(tiny_llama):
    engine = build_engine(EngineConfig(model=str(tiny_llama), dtype="float32", num_threads=1, max_model_len=128,
                                       seed=0))
    reqs = random_requests(4, engine.vocab_size, (10, 20), (3, 5), seed=1, low_token=10)
    run = run_at_rate(engine, reqs, math.nan, offsets=[0.0, 0.0, 0.05, 0.1])
    assert [len(t) for t in run.token_times] == [r.output_len for r in reqs]
    assert all(a <= b for t in run.token_times for a, b in zip(t, t[1:]))
    assert len(run.itl_ms()) == sum(r.output_len - 1 for r in reqs) and min(run.itl_ms()) >= 0
    assert len(run.itl_ms([0])) == reqs[0].output_len - 1
    assert len(run.ttft_s) == 4 and min(run.ttft_s) > 0
    assert 1 <= run.mean_running <= 4  # two requests run together from the first step
    with pytest.raises(InvalidParameterError, match="offsets"):
        run_at_rate(engine, reqs, math.nan, offsets=[0.0, 0.1])
    with pytest.raises(InvalidParameterError, match="offsets"):
        run_at_rate(engine, reqs, math.nan, offsets=[0.0, 0.2, 0.1, 0.3])


def test_rounds_rotate_the_order_and_keep_the_median_run():
    from cinq.bench.rate_run import median_by, rotated
    assert [rotated(["a", "b", "c"], n) for n in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                               ["a", "b", "c"]]
    assert rotated([], 3) == []
    runs = [{"tok_s": 5.0, "i": 0}, {"tok_s": 1.0, "i": 1}, {"tok_s": 3.0, "i": 2}]
    assert median_by(runs, "tok_s")["i"] == 2 and median_by(runs[:2], "tok_s")["i"] == 0


def test_a_core_in_its_own_process_runs_the_same_and_reports_the_same_sizes(tiny_llama):
    """``cinq tune``'s placement: the rate run reads sizes and KV state from what the core publishes, so a core
    behind ZMQ gives the in-process core's outputs (greedy), KV bytes per block and weight bytes."""
    config = EngineConfig(model=str(tiny_llama), dtype="float32", num_threads=1, max_model_len=128, seed=0)
    here = build_engine(config, engine_core="inproc")
    there = build_engine(config, engine_core="process")
    try:
        reqs = random_requests(3, here.vocab_size, (10, 20), (3, 5), seed=2, low_token=10)
        a, b = run_at_rate(here, reqs, math.inf), run_at_rate(there, reqs, math.inf)
        assert b.outputs == a.outputs
        assert b.kv_bytes_per_block == a.kv_bytes_per_block > 0
        assert b.weight_bytes == a.weight_bytes == module_bytes(here.model)
        assert b.peak_kv_blocks >= 1 and 0 <= b.kv_waste < 1
    finally:
        there.shutdown()
        here.shutdown()
