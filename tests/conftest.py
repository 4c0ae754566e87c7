"""Shared fixtures: tiny random-weight Hugging Face model folders built locally with transformers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cinq.process_env import set_omp_wait_policy

set_omp_wait_policy()  # first, before torch loads OpenMP: see cinq/process_env.py

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


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
