"""Chunked-prefill budget sweep: the workload's shape, and a short run whose every sample is accounted for."""

from __future__ import annotations

import pytest

from benchmarks.chunked_prefill import ChunkedPrefillOptions, chunked_workload, run_chunked_prefill
from cinq.bench.report import markdown
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError
from cinq.model.tokenizer import Tokenizer

SMALL = dict(num_decoding=2, decode_prompt_len=8, decode_output_len=6, num_long=2, long_prompt_len=(60, 80),
             long_output_len=2, first_long_s=0.0, long_interval_s=0.01)


def test_workload_decodes_first_then_long_prompts(tiny_llama):
    opts = ChunkedPrefillOptions(**SMALL)
    work = chunked_workload(Tokenizer.from_pretrained(tiny_llama), opts)
    assert work.decoding == [0, 1] and work.long == [2, 3]
    assert work.offsets == [0.0, 0.0, 0.0, 0.01]
    assert all(len(work.requests[i].prompt) == 8 and work.requests[i].output_len == 6 for i in work.decoding)
    assert all(60 <= len(work.requests[i].prompt) <= 80 for i in work.long)
    prompts = [tuple(r.prompt) for r in work.requests]
    assert len(set(prompts)) == len(prompts)


@pytest.mark.parametrize("bad, param", [({"budgets": (2, 64)}, "budgets"), ({"long_prompt_len": (9, 3)},
                                                                              "long_prompt_len"),
                                        ({"decode_output_len": 1}, "decode_output_len"), ({"repeats": 0}, "repeats")])
def test_bad_options_name_the_field(bad, param):
    with pytest.raises(InvalidParameterError) as err:
        ChunkedPrefillOptions(**{**SMALL, **bad}).validate()
    assert err.value.param == param


def test_run_measures_every_budget_and_counts_every_sample(tiny_llama):
    opts = ChunkedPrefillOptions(budgets=(16, 128), repeats=2, **SMALL)
    cfg = EngineConfig(model=str(tiny_llama), dtype="float32", num_threads=1, max_model_len=128, seed=0)
    res = run_chunked_prefill(cfg, opts, progress=False)
    rows = res.data["rows"]
    assert [r["budget"] for r in rows] == [16, 128]
    for r in rows:
        assert r["itl_samples"] == 2 * 2 * 5 and r["ttft_samples"] == 2 * 2 and len(r["seconds"]) == 2
        assert 0 < r["ttft_long_p50_ms"] <= r["ttft_long_p99_ms"]
        assert 0 <= r["itl_p50_ms"] <= r["itl_p90_ms"] <= r["itl_p99_ms"] <= r["itl_max_ms"]
        assert r["total_tok_s"] > r["output_tok_s"] > 0
    assert "max_num_batched_tokens" in markdown(res) and res.notes[0].startswith("Reading")
    too_long = EngineConfig(model=str(tiny_llama), dtype="float32", num_threads=1, max_model_len=64, seed=0)
    with pytest.raises(InvalidParameterError, match="max_model_len"):
        run_chunked_prefill(too_long, opts, progress=False)
