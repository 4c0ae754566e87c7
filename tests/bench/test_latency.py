"""Batch-1 latency: cinq's samples per prompt length, the transformers baseline when it can be imported, llama.cpp
when asked for (one ABSENT line without it). Never timings: only what was measured and how it is paired."""

from __future__ import annotations

import pytest

from cinq.bench import latency_engines
from cinq.bench.latency import LatencyOptions, run_latency
from cinq.bench.latency_engines import CinqRunner
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError


def _config(folder) -> EngineConfig:
    return EngineConfig(model=str(folder), dtype="float32", max_model_len=128)


def test_without_transformers_cinq_is_measured_and_the_missing_baseline_said(tiny_llama, monkeypatch):
    monkeypatch.setattr("cinq.bench.hf_baseline.hf_available", lambda: False)
    result = run_latency(_config(tiny_llama), LatencyOptions(input_lens=(8,), output_len=5, num_iters=2),
                         progress=False)
    (row,) = result.data["rows"]
    assert row["engine"] == "cinq fp32" and row["vs"] is None and row["ratio"] is None
    assert "transformers is not installed" in result.headline
    assert [r[3] for r in result.tables[0].rows] == ["cinq fp32"]
    assert len(row["tok_s_runs"]) == 2 and row["tok_s"] > 0
    assert row["ttft_ms"]["p99"] >= row["ttft_ms"]["median"]


def test_absent_llama_cpp_is_one_line_and_the_rest_still_runs(tiny_llama, monkeypatch, tmp_path):
    monkeypatch.setattr(latency_engines, "llama_cpp_missing", lambda: "llama-cpp-python not installed")
    result = run_latency(_config(tiny_llama), LatencyOptions(input_lens=(8,), output_len=3, num_iters=1,
                                                            baselines=("hf", "llama.cpp"), variants=("bf16",),
                                                            work_dir=tmp_path), progress=False)
    assert [r["engine"] for r in result.data["rows"]] == ["cinq bf16", "HF bf16"]
    assert result.data["rows"][0]["vs"] == "HF bf16"  # without llama.cpp, cinq is paired with HF
    assert result.data["llama_cpp_absent"] == "llama-cpp-python not installed"
    assert "llama.cpp baseline ABSENT: llama-cpp-python not installed" in result.headline
    assert not list(tmp_path.glob("*.gguf"))


def test_variants_pair_with_llama_cpp_types_per_thread_count(tiny_llama, tmp_path):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    result = run_latency(_config(tiny_llama), LatencyOptions(input_lens=(8,), output_len=3, num_iters=1, rounds=2,
                                                            baselines=("llama.cpp",), variants=("bf16", "int4"),
                                                            threads_list=(1, 2), work_dir=tmp_path),
                         progress=False)
    rows = result.data["rows"]
    assert [(r["threads"], r["engine"], r["vs"]) for r in rows] == [
        (t, e, vs) for t in (1, 2) for e, vs in (("cinq bf16", "llama.cpp bf16"), ("llama.cpp bf16", None),
                                                 ("cinq int4", "llama.cpp q4_0"), ("llama.cpp q4_0", None))]
    by = {(r["threads"], r["engine"]): r for r in rows}
    for r in rows:
        assert len(r["tok_s_runs"]) == 2  # one generation per round
        if r["vs"]:
            assert r["ratio"] == pytest.approx(r["tok_s"] / by[(r["threads"], r["vs"])]["tok_s"])
    assert any(note.startswith("- goal int4 >= 1.0x q4_0: ") for note in result.notes)
    assert sorted(p.name.split("-")[-1] for p in tmp_path.glob("*.gguf")) == ["bf16.gguf", "q4_0.gguf"]


def test_bad_options_name_the_field(tiny_llama):
    with pytest.raises(InvalidParameterError, match="variants must be among bf16,int8,int4,file, got fp8") as e:
        run_latency(_config(tiny_llama), LatencyOptions(variants=("fp8",)), progress=False)
    assert e.value.param == "variants"
    with pytest.raises(InvalidParameterError, match="exceeds max_model_len 128"):
        run_latency(_config(tiny_llama), LatencyOptions(input_lens=(120,), output_len=16), progress=False)


def test_gaps_are_one_fewer_than_the_tokens(tiny_llama):
    runner = CinqRunner(_config(tiny_llama))
    times = runner.run([5, 6, 7, 8], 6)
    assert times.ttft_s > 0 and len(times.gaps_s) == 5 and len(times.tokens) == 6
    assert not runner.engine.has_unfinished_requests()


def test_llama_cpp_without_variants_pairs_cinq_bf16_with_gguf_bf16(tiny_llama, tmp_path):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    result = run_latency(_config(tiny_llama), LatencyOptions(input_lens=(8,), output_len=3, num_iters=1,
                                                            baselines=("llama.cpp",), work_dir=tmp_path),
                         progress=False)
    assert [(r["engine"], r["vs"]) for r in result.data["rows"]] == [("cinq bf16", "llama.cpp bf16"),
                                                                     ("llama.cpp bf16", None)]
    assert result.data["rows"][1]["first_tokens"]  # llama.cpp hands its tokens back


def test_a_gguf_model_as_configured_is_named_for_its_file(tiny_llama, monkeypatch, tmp_path):
    # its rows run the file's blocks, not bf16 weights: "cinq bf16" against HF bf16 read as a like-for-like pair
    from cinq.export.gguf import export_gguf
    monkeypatch.setattr("cinq.bench.hf_baseline.hf_available", lambda: False)
    path = export_gguf(tiny_llama, tmp_path / "m.gguf", "q8_0").path
    config = EngineConfig(model=str(path), dtype="bfloat16", num_kv_blocks=64)
    result = run_latency(config, LatencyOptions(input_lens=(8,), output_len=3, num_iters=1), progress=False)
    assert [r["engine"] for r in result.data["rows"]] == ["cinq file"]
