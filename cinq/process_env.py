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

from cinq.errors import InvalidParameterError

DEFAULT_OMP_WAIT_POLICY = "PASSIVE"
# Every variable a wait policy sets: one of them already in the environment is the user's choice, and then cinq sets
# neither (GOMP_SPINCOUNT alone overrides OMP_WAIT_POLICY's spin in libgomp, so adding one beside the user's other
# would change what the user asked for).
OMP_WAIT_ENV_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
MAX_SPIN_COUNT = 30_000_000_000  # libgomp's own count for OMP_WAIT_POLICY=ACTIVE (minutes of spinning)


def omp_wait_env(policy: str) -> dict[str, str]:
    """The environment that gives OpenMP worker threads ``policy``, one of:

    - ``PASSIVE``: ``OMP_WAIT_POLICY=PASSIVE``; a worker with no work sleeps at once (libgomp spin count 0).
    - ``ACTIVE``: ``OMP_WAIT_POLICY=ACTIVE``; it spins until the next parallel region (libgomp: 30 billion spins).
    - ``SPIN=n`` (n an integer, 0 to 30 billion): ``OMP_WAIT_POLICY=PASSIVE`` and ``GOMP_SPINCOUNT=n``. libgomp
      (torch's and llama.cpp's OpenMP) takes a set GOMP_SPINCOUNT over the policy's count, so a worker spins n
      times (libgomp's estimate: about 100,000 a millisecond) and then sleeps; with PASSIVE, libgomp's throttled
      count (used when a process runs more OpenMP threads than it has CPUs) stays 0, so an oversubscribed process
      never spins, and OpenMP runtimes that ignore GOMP_SPINCOUNT (LLVM's, Intel's) sleep at once.

    Raises ``InvalidParameterError`` (field ``policy``) for anything else."""
    name = policy.strip().upper()
    if name in ("PASSIVE", "ACTIVE"):
        return {"OMP_WAIT_POLICY": name}
    if name.startswith("SPIN="):
        count = name.removeprefix("SPIN=").replace("_", "")
        if count.isdigit() and int(count) <= MAX_SPIN_COUNT:
            return {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(int(count))}
    raise InvalidParameterError(f"OpenMP wait policy must be PASSIVE, ACTIVE or SPIN=n with n an integer from 0 to "
                                f"{MAX_SPIN_COUNT}, got {policy!r}", "policy")


def set_omp_wait_policy(policy: str = DEFAULT_OMP_WAIT_POLICY, *, warn: bool = True) -> bool:
    """Give this process and the processes it starts the OpenMP wait ``policy`` (default PASSIVE; the forms and
    the variables each sets: ``omp_wait_env``); an ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` already in the
    environment wins, and then nothing is set.

    OpenMP reads the variables once, when torch loads it: spinning worker threads make every parallel op many times
    slower whenever the cores are shared with other processes (measured 4-25x on a busy 2-core machine), while
    sleeping ones cost a few microseconds per op on an idle one. ``benchmarks/omp_wait_policy.py`` measures the
    policies for cinq and for llama.cpp, each engine in its own process. Since the fused decode step opens one
    parallel region per step (cinq/model/decode_layers.py), cinq no longer needs its workers to spin: on an idle
    2-core machine its 2-thread SmolLM2 int4 decode ran 127.7 tok/s PASSIVE, 125.1 ACTIVE and 111 with 3,000 spins
    (llama.cpp q4_0: 73.4, 127.9 and 135), while on a shared machine spinning made cinq's 2-thread decode 0.02-0.1x
    (drafts at load 6-14). PASSIVE stays the default. A bounded spin (``SPIN=n``: spin n times, then sleep) can be
    asked for; a draft on a shared machine found 10,000 spins already halved 2-thread decode under load.

    Returns True when this process runs with the values now in the environment, False when torch was imported
    before this call set them (then only child processes get them; ``warn`` says so with a ``RuntimeWarning``)."""
    wanted = omp_wait_env(policy)  # a bad policy is an error even where the user's variables would win
    if any(var in os.environ for var in OMP_WAIT_ENV_VARS):
        return True  # the user's (or a parent's) choice; whoever set it did so before torch could read it here
    os.environ.update(wanted)
    if "torch" not in sys.modules:
        return True
    if warn:
        settings = " ".join(f"{k}={v}" for k, v in wanted.items())
        warnings.warn("OMP_WAIT_POLICY was set after torch was imported: this process keeps OpenMP's default, only "
                      "child processes get " + settings + "; call cinq.process_env.set_omp_wait_policy() before "
                      "importing torch", RuntimeWarning, stacklevel=2)
    return False
