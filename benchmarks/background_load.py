"""Busy background processes, so that "under load" is a condition a benchmark creates and labels, not an accident
of whatever else the machine ran.

Each process is a pure-Python spin loop (one core's worth of work, no memory traffic to speak of) that checks
every few tens of milliseconds whether its parent is still alive, so even a parent killed with SIGKILL leaves no
spinner behind for long; the context manager kills them on the way out, error or not.

    with busy_processes(2):
        ...  # measured with 2 cores' worth of competing work
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Spin, and every 200k iterations (tens of ms) stop if the parent is gone (re-parented: getppid changes). The
# parent's pid comes as an argument: a parent that died before this interpreter started is then noticed too.
SPIN_LOOP = ("import os, sys\n"
             "parent = int(sys.argv[1])\n"
             "while os.getppid() == parent:\n"
             "    for _ in range(200_000):\n"
             "        pass\n")


@contextmanager
def busy_processes(count: int) -> Iterator[list[subprocess.Popen]]:
    """Run ``count`` busy processes for the duration of the block (none for 0); they are killed and reaped when
    the block ends, however it ends."""
    if count < 0:
        raise ValueError(f"--under-load must be 0 or more busy processes, got {count}")
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", SPIN_LOOP, str(os.getpid())], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
