"""scripts/gpu_check.sh, the one prepared run for a lent GPU: it must fit the time a run is given and select the
tests it says it runs (checked here, where no GPU is, so that a lent machine's minutes are not spent finding out)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"
RUN_LIMIT_S = 480  # the 8 minutes for one run, leaving a rerun within the session's device time


def _parts() -> list[tuple[str, int, str]]:
    """(name, limit in seconds, the command with its continuation lines) of each `part` the script runs."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    return [(m[1], int(m[2]), m[3]) for m in re.finditer(r"^part (\S+) (\d+) (.*)$", text, re.M)]


def test_the_parts_limits_fit_one_run():
    parts = _parts()
    assert len(parts) >= 6 and sum(limit for _, limit, _ in parts) <= RUN_LIMIT_S, parts


def test_the_test_part_selects_the_cuda_graph_test_and_the_triton_tests():
    (cmd,) = [c for name, _, c in _parts() if name == "triton-tests"]
    args = cmd.split()[cmd.split().index("pytest") + 1:]
    args = [a.strip('"') for a in args]
    k = args.index("-k")
    expr = cmd[cmd.index("-k") + 3:].strip().strip('"')
    files = [a for a in args[:k] if a.startswith("tests/")]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", "-m", "not slow",
                          "-k", expr, *files], cwd=SCRIPT.parents[1], capture_output=True, text=True, timeout=300)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    cuda_test = "tests/engine/test_compiled_decode.py::test_cuda_graph_step_gives_the_eager_tokens"
    assert cuda_test in ids, out.stdout[-2000:]
    assert not [i for i in ids if "test_compiled_decode.py" in i and "cuda" not in i]  # the CPU ones run in CI
    assert sum("test_triton_decode.py" in i for i in ids) > 10 and any("test_compiled_kernels" in i for i in ids)
