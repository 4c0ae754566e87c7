"""Batch-1 latency: cinq's samples per prompt length, the transformers baseline when it can be imported."""

from __future__ import annotations

from cinq.bench import latency
from cinq.bench.latency import LatencyOptions, run_latency
from cinq.config import EngineConfig


def test_without_transformers_cinq_is_measured_and_the_missing_baseline_said(tiny_llama, monkeypatch):
    monkeypatch.setattr(latency, "hf_available", lambda: False)
    result = run_latency(EngineConfig(model=str(tiny_llama), dtype="float32"),
                         LatencyOptions(input_lens=(8,), output_len=5, num_iters=2), progress=False)
    (row,) = result.data["rows"]
    assert row["hf"] is None and "decode_speedup" not in row
    assert "transformers is not installed" in result.headline
    assert [r[1] for r in result.tables[0].rows] == ["cinq"]
    assert row["cinq"]["decode_tok_s"] > 0 and row["cinq"]["ttft_ms"]["p99"] >= row["cinq"]["ttft_ms"]["median"]


def test_gaps_are_one_fewer_than_the_tokens(tiny_llama):
    from cinq.engine.engine import LLMEngine
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32"))
    ttft, gaps = latency._cinq_token_times(engine, [5, 6, 7, 8], 6)
    assert ttft > 0 and len(gaps) == 5 and not engine.has_unfinished_requests()
