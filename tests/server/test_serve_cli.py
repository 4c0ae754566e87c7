"""`cinq serve` as a user runs it: a subprocess that prints model, dtype, KV blocks and URL, serves, and stops
cleanly on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, str]:
    """Start `cinq serve ARGS`; return the process, its URL and the banner printed up to it."""
    cmd = [sys.executable, "-m", "cinq.cli", "serve", *args, "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while True:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        lines.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1), "".join(lines)


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_cinq_serve_starts_prints_and_serves(tiny_llama):
    # one server for the banner, auth, a completion and the connection flags (a start is a process and an engine)
    env = {**os.environ, "CINQ_API_KEY": "k3y"}  # the key from the environment, as in a deployment
    proc, url, banner = _start([str(tiny_llama), "--dtype", "float32", "--num-kv-blocks", "48",
                                "--served-model-name", "my-model", "--request-body-timeout", "0.5",
                                "--limit-concurrency", "64"], env)
    try:
        assert str(tiny_llama) in banner and "float32" in banner and "48 blocks" in banner and "auth on" in banner
        assert "request timeout 0.5 s, concurrency cap 64" in banner
        auth = {"Authorization": "Bearer k3y"}
        models = httpx.get(url + "/v1/models", headers=auth, timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["my-model"]
        out = httpx.post(url + "/v1/completions", headers=auth, timeout=30,
                         json={"model": "my-model", "prompt": "hi", "max_tokens": 3, "ignore_eos": True}).json()
        assert out["usage"]["completion_tokens"] == 3
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
        import socket
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k3y\r\n"
                      b"content-length: 100\r\n\r\n{\"pro")
            assert s.recv(100).startswith(b"HTTP/1.1 408")  # the body-timeout flag reached the server
    finally:
        rc = _stop(proc)
    assert rc == 0
    core = int(re.search(r"engine core in process (\d+)", banner).group(1))  # cinq serve's default: its own
    try:
        state = Path(f"/proc/{core}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    assert state in ("gone", "Z")  # stopped with the server: no orphan


def test_cinq_serve_without_a_model_serves_the_embedded_one_by_its_name():
    from cinq.assets import default_model_path
    name = default_model_path().name  # cinq-tiny when shipped
    proc, url, _ = _start(["--num-kv-blocks", "32"])
    try:
        assert [m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]] == [name]
        out = httpx.post(url + "/v1/completions", timeout=30,
                         json={"model": name, "prompt": "Once", "max_tokens": 2, "ignore_eos": True}).json()
        assert out["model"] == name and out["usage"]["completion_tokens"] == 2
    finally:
        assert _stop(proc) == 0


def test_cinq_serve_reports_a_taken_port(tiny_llama):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "cinq.cli", "serve", str(tiny_llama), "--port", str(port),
                            "--num-kv-blocks", "16"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "cannot bind" in r.stderr and str(port) in r.stderr


def test_cinq_serve_refuses_a_bad_connection_flag(tiny_llama):
    r = subprocess.run([sys.executable, "-m", "cinq.cli", "serve", str(tiny_llama), "--request-body-timeout", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "request_body_timeout must be > 0" in r.stderr
