"""Fixtures of the server tests (the helpers live in harness.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.harness import RunningServer, serve


@pytest.fixture(scope="module")
def server(tiny_llama) -> Iterator[RunningServer]:
    """Each module's server: tiny Llama, float32 (deterministic greedy), no auth, no waiting bound; stopped when
    the module is done so no engine thread outlives its tests."""
    with serve(tiny_llama, max_num_seqs=64) as s:
        yield s


@pytest.fixture(scope="session")
def tokenizer(tiny_llama):
    from cinq.model.tokenizer import Tokenizer
    return Tokenizer.from_pretrained(tiny_llama)
