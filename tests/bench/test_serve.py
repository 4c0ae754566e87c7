"""cinq/bench/serve.py: the CPU accounting of the server process (the rest runs through `cinq bench serve` in
tests/commands/test_bench.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cinq.bench.serve import process_cpu_s

BURN = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nsys.stdin.read()"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_cpu_s_counts_a_childs_cpu_time():
    proc = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while process_cpu_s(proc) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        used = process_cpu_s(proc)
        assert 0.25 <= used < 30  # the burn loop's 0.3 s (plus start-up), read from outside the process
    finally:
        proc.kill()
        proc.wait()


def test_process_cpu_s_without_a_process_is_zero():
    assert process_cpu_s(None) == 0.0
