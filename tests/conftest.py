"""Shared fixtures: tiny random-weight Hugging Face model folders built locally with transformers."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from cinq.process_env import set_omp_wait_policy

set_omp_wait_policy()  # first, before torch loads OpenMP: see cinq/process_env.py

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The offline LLM / cinq generate keep the engine core in this process (tests reach llm.engine's scheduler and
# model, and a core process per LLM would cost a start each); the process core has its own tests.
os.environ.setdefault("CINQ_ENGINE_CORE", "inproc")


def pytest_configure(config: pytest.Config) -> None:
    import torch
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory):
    """``tiny_models(arch)`` -> folder of a tiny model of that architecture (built once per session)."""
    from tests.model_factory import build_tiny_model
    cache: dict[str, Path] = {}

    def get(arch: str = "llama") -> Path:
        if arch not in cache:
            cache[arch] = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def tiny_llama(tiny_models) -> Path:
    return tiny_models("llama")


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """``run_cli(*args, stdin="")``: ``cinq ARGS`` through ``cinq.cli.main`` in the test process, reported as
    ``subprocess.run`` reports a process (returncode, stdout, stderr).

    Each ``python -m cinq.cli`` process pays torch's import (3-5 s on this loaded 2-core machine); keep a process
    for what needs one (a signal, a possible hang bounded by a timeout, the entry point itself)."""
    from cinq.cli import main

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        capsys.readouterr()
        try:
            status = main(list(args))
        except SystemExit as e:  # argparse's refusals
            status = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["cinq", *args], status, out.out, out.err)

    return run
