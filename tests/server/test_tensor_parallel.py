"""The server over a tensor-parallel engine (TP = 2, gloo): completions, whole and streamed, as with one device;
in-process, and with the engine core in its own process (rank 0 of the TP group is then the core process)."""

from __future__ import annotations

import httpx
import pytest

from cinq import LLM, SamplingParams
from tests.server.harness import MODEL_NAME, serve


@pytest.mark.parametrize("engine_core", ["inproc", pytest.param("process", marks=pytest.mark.slow)])
def test_completions_with_tensor_parallel_size_2(tiny_llama, engine_core):
    expected = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64).generate(
        ["The quick brown fox"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].outputs[0].text
    with serve(tiny_llama, tensor_parallel_size=2, engine_core=engine_core) as server:
        try:
            body = {"model": MODEL_NAME, "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0,
                    "ignore_eos": True}
            r = httpx.post(server.api + "/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == expected
            with httpx.stream("POST", server.api + "/completions", json={**body, "stream": True}, timeout=60) as s:
                chunks = [line for line in s.iter_lines() if line.startswith("data: {")]
            assert len(chunks) >= 2
        finally:
            server.llm.shutdown()
            server.engine.shutdown()
