"""The long soak (slow: `pytest -m slow tests/reliability/test_soak.py`): 10,000 mixed requests (chat and
completions, streaming, n = 2, stops, logprobs, echo, shared prefixes, seeded probes, 50 MB bodies) against the
embedded cinq-tiny served in bf16 with 0.6 GiB of KV, 24 at a time. Every request succeeds, seeded probes equal
their solo runs, no block is held after, and the process's RSS after the first 500 requests stays within 15%."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from benchmarks.reliability import RSSSampler, rss_summary, run_mixed
from tests.server.harness import MODEL_NAME, serve


@pytest.mark.slow
def test_10k_mixed_requests_flat_memory():
    from cinq.assets import default_model_path
    requests = int(os.environ.get("CINQ_SOAK_REQUESTS", "10000"))
    with serve(default_model_path(), dtype="bfloat16", num_kv_blocks=None, kv_cache_memory=0.6,
               max_num_seqs=128) as server:
        progress = [0]
        with RSSSampler(os.getpid(), progress) as sampler:
            res = asyncio.run(run_mixed(server.url, MODEL_NAME, requests, 24, big_every=100, big_mb=50,
                                        progress=progress))
        stats = server.wait_idle(60)
    assert res["failed"] == 0, res["errors"]
    assert res["probe_mismatches"] == 0 and res["probe_solo_failed"] == 0
    assert stats["kv_cache_usage"] == 0 and stats["step_failures"] == 0
    rss = rss_summary(sampler.samples, 500)
    assert rss["growth_after_warmup_pct"] <= 15, rss
    assert threading.active_count() < 50  # no per-request threads left behind
