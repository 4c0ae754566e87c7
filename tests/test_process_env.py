"""OMP_WAIT_POLICY / GOMP_SPINCOUNT: set only when asked (the CLI, or a library user calling set_omp_wait_policy),
never on import; a user's own value of either wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cinq.errors import InvalidParameterError
from cinq.process_env import omp_wait_env, set_omp_wait_policy

def run(code: str, **env: str) -> str:
    """stdout, then stderr (warnings), of ``code`` in a fresh interpreter that starts without OMP_WAIT_POLICY or
    GOMP_SPINCOUNT."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
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


@pytest.mark.parametrize("policy,env", [
    ("PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("active", {"OMP_WAIT_POLICY": "ACTIVE"}),
    ("SPIN=100000", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "100000"}),
    ("spin=10_000", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}),
    ("SPIN=0", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}),
])
def test_each_policy_form_maps_to_its_variables(policy: str, env: dict[str, str]) -> None:
    assert omp_wait_env(policy) == env


@pytest.mark.parametrize("policy", ["SLEEPY", "SPIN=", "SPIN=-5", "SPIN=1e5", "SPIN=30000000001", ""])
def test_a_bad_policy_names_the_field_and_the_forms(policy: str) -> None:
    with pytest.raises(InvalidParameterError, match="PASSIVE, ACTIVE or SPIN=n") as err:
        omp_wait_env(policy)
    assert err.value.param == "policy"


def test_a_bounded_spin_reaches_torchs_openmp_runtime():
    # libgomp prints the values it runs with (OMP_DISPLAY_ENV) when torch loads it: the spin count is the one asked
    out = run("from cinq.process_env import set_omp_wait_policy; set_omp_wait_policy('SPIN=100000'); import torch",
              OMP_DISPLAY_ENV="VERBOSE")
    assert "GOMP_SPINCOUNT = '100000'" in out
    passive = run("from cinq.process_env import set_omp_wait_policy; set_omp_wait_policy(); import torch",
                  OMP_DISPLAY_ENV="VERBOSE")
    assert "GOMP_SPINCOUNT = '0'" in passive


def test_the_users_spin_count_wins_and_nothing_is_added_beside_it():
    out = run("import os; from cinq.process_env import set_omp_wait_policy; ok = set_omp_wait_policy('ACTIVE'); "
              "print(ok, os.environ.get('OMP_WAIT_POLICY'), os.environ['GOMP_SPINCOUNT'])", GOMP_SPINCOUNT="5000")
    assert out == "True None 5000"


def test_a_bad_policy_is_an_error_even_where_the_users_value_would_win(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    with pytest.raises(InvalidParameterError):
        set_omp_wait_policy("SPIN=lots")
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_setting_after_torch_names_every_variable_it_set():
    out = run("import torch; from cinq.process_env import set_omp_wait_policy; set_omp_wait_policy('SPIN=2000')")
    assert "only child processes get OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=2000" in out
