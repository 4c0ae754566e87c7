"""`cinq serve --data-parallel-size`: a bad size is refused before anything starts; a live 2-replica server
(its own local Ray cluster, slow) serves and exports the router's series."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.server.test_serve_cli import _start, _stop


def test_bad_data_parallel_size_is_refused_before_anything_starts() -> None:
    r = subprocess.run([sys.executable, "-m", "cinq.cli", "serve", "--data-parallel-size", "0", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "data_parallel_size must be an integer in [1, 1024], got 0" in r.stderr


@pytest.mark.slow
def test_cinq_serve_with_two_replicas(tiny_llama) -> None:
    pytest.importorskip("ray")
    proc, url, banner = _start([str(tiny_llama), "--dtype", "float32", "--num-kv-blocks", "48",
                                "--data-parallel-size", "2"])
    try:
        assert "starting 2 replica(s) on Ray" in banner and "48 blocks" in banner and "per replica" in banner
        for i in range(4):
            out = httpx.post(url + "/v1/completions", timeout=60,
                             json={"prompt": f"hello {i} " * 20, "max_tokens": 3, "ignore_eos": True}).json()
            assert out["usage"]["completion_tokens"] == 3
        metrics = httpx.get(url + "/metrics", timeout=10).text
        assert 'cinq:dp_replica_up{model_name=' in metrics and 'replica="1"' in metrics
        assert "cinq:dp_requests_completed_total" in metrics
    finally:
        rc = _stop(proc)
    assert rc == 0
