"""`cinq generate` / `cinq chat` / `cinq init-model` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys


def cinq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cinq.cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def test_init_model_then_generate_json(tmp_path):
    out = tmp_path / "m"
    r = cinq("init-model", str(out), "--hidden-size", "64", "--num-layers", "2", "--num-kv-heads", "2")
    assert r.returncode == 0, r.stderr
    r = cinq("generate", str(out), "-p", "abc", "-p", "xyz", "--max-tokens", "5", "--temperature", "0",
             "--ignore-eos", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["prompt"] for row in rows] == ["abc", "xyz"] and all(row["num_tokens"] == 5 for row in rows)
    assert "KV cache" in r.stderr  # start-up report


def test_chat_streams_reply_and_quits_on_empty_line(tiny_llama):
    r = cinq("chat", str(tiny_llama), "--max-tokens", "4", "--temperature", "0", "--ignore-eos",
             stdin="hello\nagain\n\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("assistant> ") == 2


def test_bad_flag_value_is_one_clear_line(tiny_llama):
    r = cinq("generate", str(tiny_llama), "--temperature", "-1")
    assert r.returncode == 2 and "temperature must be in [0.0, 100.0]" in r.stderr
    assert "Traceback" not in r.stderr
