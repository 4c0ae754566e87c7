"""Process-wide settings cinq wants before torch starts, applied only when asked.

The ``cinq`` command applies them itself; a program using cinq as a library calls
``set_omp_wait_policy()`` first thing, before it (or anything it imports) imports torch::

    from cinq.process_env import set_omp_wait_policy
    set_omp_wait_policy()
    from cinq import LLM

Importing ``cinq`` changes nothing in the process: the choice is the program's.
"""

from __future__ import annotations

import os
import sys
import warnings

DEFAULT_OMP_WAIT_POLICY = "PASSIVE"


def set_omp_wait_policy(policy: str = DEFAULT_OMP_WAIT_POLICY, *, warn: bool = True) -> bool:
    """Set ``OMP_WAIT_POLICY`` (default PASSIVE) for this process and the processes it starts; a value already in
    the environment wins and is left as it is.

    OpenMP reads the variable once, when torch loads it: spinning worker threads make every parallel op many times
    slower whenever the cores are shared with other processes (measured 4-25x on a busy 2-core machine), while
    sleeping ones cost a few microseconds per op on an idle one. ``benchmarks/omp_wait_policy.py`` measures both
    policies for cinq and for llama.cpp, each engine in its own process: on an idle 2-core machine spinning makes
    cinq's 2-thread decode 1.50x faster (llama.cpp's 1.58x) and its 1-thread decode 0.92x; on a shared one (a
    draft run at load 11-14) it made cinq's 2-thread decode 0.02x. PASSIVE stays the default (a server shares its
    cores with its front end and clients); set ``OMP_WAIT_POLICY=ACTIVE`` on a machine given to cinq alone.

    Returns True when this process runs with the value now in the environment, False when torch was imported
    before this call set it (then only child processes get it; ``warn`` says so with a ``RuntimeWarning``)."""
    if "OMP_WAIT_POLICY" in os.environ:
        return True  # the user's (or a parent's) choice; whoever set it did so before torch could read it here
    os.environ["OMP_WAIT_POLICY"] = policy
    if "torch" not in sys.modules:
        return True
    if warn:
        warnings.warn("OMP_WAIT_POLICY was set after torch was imported: this process keeps OpenMP's default, only "
                      "child processes get " + policy + "; call cinq.process_env.set_omp_wait_policy() before "
                      "importing torch", RuntimeWarning, stacklevel=2)
    return False
