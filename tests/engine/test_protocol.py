"""Where the offline front ends put the engine core: ``default_offline_engine_core`` and its environment variable,
and bad values refused before any model loads."""

from __future__ import annotations

import pytest

from cinq.engine.llm import LLM
from cinq.engine.protocol import ENGINE_CORE_ENV, default_offline_engine_core, make_engine_client
from cinq.errors import InvalidParameterError


def test_offline_default_is_the_process_core_unless_the_environment_says_otherwise(monkeypatch):
    monkeypatch.delenv(ENGINE_CORE_ENV, raising=False)
    assert default_offline_engine_core() == "process"
    monkeypatch.setenv(ENGINE_CORE_ENV, "inproc")
    assert default_offline_engine_core() == "inproc"


def test_a_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(ENGINE_CORE_ENV, "threads")
    with pytest.raises(InvalidParameterError, match=f"{ENGINE_CORE_ENV} must be one of process, inproc") as e:
        default_offline_engine_core()
    assert e.value.param == ENGINE_CORE_ENV


@pytest.mark.parametrize("build", [lambda: LLM("no-such-model", engine_core="thread"),
                                   lambda: make_engine_client(None, None, "thread")])  # type: ignore[arg-type]
def test_a_bad_engine_core_is_refused_before_anything_loads(build):
    with pytest.raises(InvalidParameterError, match="engine_core must be one of process, inproc, got 'thread'"):
        build()
