"""OMP_WAIT_POLICY: set only when asked (the CLI, or a library user calling set_omp_wait_policy), never on import."""

from __future__ import annotations

import os
import subprocess
import sys


def run(code: str, **env: str) -> str:
    """stdout, then stderr (warnings), of ``code`` in a fresh interpreter that starts without OMP_WAIT_POLICY."""
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    r = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120,
                       env={**clean, **env}, check=True)
    return (r.stdout + r.stderr).strip()


def test_importing_cinq_sets_nothing():
    assert run("import os, cinq, cinq.config, cinq.cli; print(os.environ.get('OMP_WAIT_POLICY'))") == "None"


def test_set_before_torch_applies_to_this_process():
    out = run("import os; from cinq.process_env import set_omp_wait_policy; ok = set_omp_wait_policy(); "
              "import torch; print(ok, os.environ['OMP_WAIT_POLICY'])")
    assert out == "True PASSIVE"


def test_set_after_torch_warns_that_it_is_too_late():
    out = run("import os, torch; from cinq.process_env import set_omp_wait_policy; ok = set_omp_wait_policy(); "
              "print(ok, os.environ['OMP_WAIT_POLICY'])")
    assert out.startswith("False PASSIVE") and "RuntimeWarning" in out and "after torch was imported" in out
    quiet = run("import torch; from cinq.process_env import set_omp_wait_policy; "
                "print(set_omp_wait_policy(warn=False))")
    assert quiet == "False"


def test_the_users_value_wins():
    out = run("import os, torch; from cinq.process_env import set_omp_wait_policy; ok = set_omp_wait_policy(); "
              "print(ok, os.environ['OMP_WAIT_POLICY'])", OMP_WAIT_POLICY="ACTIVE")
    assert out == "True ACTIVE"  # no warning either: the value was there before torch loaded


def test_cli_sets_it_before_any_command_imports_torch():
    out = run("import os, sys, cinq.cli; cinq.cli.main([]); "
              "print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)")
    assert out.endswith("PASSIVE False")
