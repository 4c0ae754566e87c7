"""benchmarks/background_load.py: the busy processes run for the block, are gone after it (error or not), and
stop by themselves when their parent dies without cleaning up."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.background_load import busy_processes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_processes_spin_during_the_block_and_are_reaped_after_it() -> None:
    with busy_processes(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
        time.sleep(0.3)
        assert all(p.poll() is None for p in procs)  # still spinning, not exited on their own
    assert all(p.returncode is not None for p in procs)


def test_an_error_in_the_block_still_kills_them() -> None:
    with pytest.raises(RuntimeError), busy_processes(1) as procs:
        raise RuntimeError("benchmark failed")
    assert procs[0].returncode is not None


def test_none_for_zero_and_an_error_for_a_negative_count() -> None:
    with busy_processes(0) as procs:
        assert procs == []
    with pytest.raises(ValueError, match="--under-load"), busy_processes(-1):
        pass


def test_a_spinner_stops_when_its_parent_dies_without_cleaning_up() -> None:
    code = ("import os, sys\nfrom benchmarks.background_load import busy_processes\n"
            "cm = busy_processes(1)\nprocs = cm.__enter__()\nprint(procs[0].pid, flush=True)\nos._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
