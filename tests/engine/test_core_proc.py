"""The engine core's process as the front end sees it: a core that cannot start raises its own one-line error (not
a ZMQ timeout) and leaves nothing behind; a front end that is killed takes its core with it; SIGTERM to `cinq serve`
stops the server and its core with no process or socket folder left."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cinq.config import EngineConfig
from cinq.errors import ModelLoadError
from tests.server.test_split_server import child_pids


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_a_start_up_failure_is_the_cores_own_error(tiny_llama, tmp_path):
    from cinq.engine.async_mp_llm import AsyncMPLLM
    from cinq.engine.engine import LLMEngine

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    (broken / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": ')
    config = EngineConfig.from_kwargs(str(broken), dtype="float32", num_kv_blocks=16)
    with pytest.raises(ModelLoadError) as in_process:
        LLMEngine(config)
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("cinq-core-*"))
    children = child_pids(os.getpid())  # other tests' helpers (a Ray cluster) may be running
    with pytest.raises(ModelLoadError) as split:
        AsyncMPLLM(config)
    assert str(split.value) == str(in_process.value) and split.value.param == in_process.value.param
    assert "config.json" in str(split.value) and "\n" not in str(split.value)
    assert child_pids(os.getpid()) <= children  # the core exited and was reaped
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("cinq-core-*")) <= before  # its socket folder too


@pytest.mark.slow
def test_a_killed_front_end_takes_its_core_with_it(tiny_llama, tmp_path):
    script = textwrap.dedent(f"""
        import asyncio, sys, time
        from cinq.config import EngineConfig
        from cinq.engine.async_mp_llm import AsyncMPLLM
        if __name__ == "__main__":
            llm = AsyncMPLLM(EngineConfig.from_kwargs({str(tiny_llama)!r}, dtype="float32", num_kv_blocks=16))
            print(llm.core_pid, llm.client.socket_dir, flush=True)
            time.sleep(600)
    """)
    path = tmp_path / "front.py"
    path.write_text(script)
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        pid, socket_dir = proc.stdout.readline().split()
        assert int(pid) in child_pids(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)
    assert _gone(int(pid), 10)  # the core saw its front end go within a poll
    assert not Path(socket_dir).exists()


@pytest.mark.slow
def test_sigterm_stops_cinq_serve_and_its_core(tiny_llama):
    cmd = [sys.executable, "-m", "cinq.cli", "serve", str(tiny_llama), "--dtype", "float32", "--num-kv-blocks",
           "32", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    banner = ""
    try:
        while "listening on" not in banner:
            line = proc.stdout.readline()
            assert line, banner
            banner += line
        core = int(re.search(r"engine core in process (\d+)", banner).group(1))
        assert core in child_pids(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _gone(core, 5)
