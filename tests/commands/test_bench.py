"""`cinq bench KIND` end to end on a tiny model with tiny sizes: the table on stdout holds the baseline row and the
ratio, and PREFIX.json / .md / .png are written. Never timings: only that each was measured and reported."""

from __future__ import annotations

import json

import pytest

from cinq.bench.throughput import peak_dtype
from cinq.cli import main

ENGINE = ["--dtype", "float32", "--num-threads", "1", "--max-model-len", "256", "--no-progress"]


def bench(capsys, tmp_path, kind: str, *argv: str) -> tuple[str, dict]:
    prefix = tmp_path / kind
    assert main(["bench", kind, *argv, *ENGINE, "--out", str(prefix)]) == 0
    out = capsys.readouterr().out
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"{kind}.{ext}").stat().st_size > 0, ext
    data = json.loads((tmp_path / f"{kind}.json").read_text())
    assert data["kind"] == kind and data["headline"] in out
    assert data["headline"] in (tmp_path / f"{kind}.md").read_text()
    return out, data


def test_throughput(capsys, tmp_path, tiny_llama):
    out, data = bench(capsys, tmp_path, "throughput", str(tiny_llama), "--num-prompts", "4", "--input-len", "8-16",
                      "--output-len", "3-5", "--hf-batch-sizes", "2", "--hf-probe-requests", "2",
                      "--decode-tokens", "4")
    assert "HF transformers generate (baseline)" in out and "cinq / HF" in out
    assert data["cinq"]["tokens"] == data["hf"]["tokens"] == data["workload"]["output_tokens"]
    assert data["ratio_cinq_over_hf"] == pytest.approx(data["cinq"]["tok_s"] / data["hf"]["tok_s"])


def test_throughput_without_baseline_reports_the_compute_roofline(capsys, tmp_path, tiny_llama):
    out, data = bench(capsys, tmp_path, "throughput", str(tiny_llama), "--num-prompts", "3", "--input-len", "8",
                      "--output-len", "2", "--decode-tokens", "2", "--no-baseline")
    (run,) = data["variants"]
    assert data["hf"] is None and run is not None and data["cinq"]["engine"] == run["engine"] == "cinq"
    assert data["roofline"]["total_flops"] > 0 and data["roofline"]["peak_dtype"] == peak_dtype()
    assert run["fraction_of_peak"] == data["roofline"]["total_flops"] / run["seconds"] / data["roofline"]["peak_flop_s"]
    assert "of the compute roofline; baseline skipped" in out


def test_latency(capsys, tmp_path, tiny_llama):
    out, data = bench(capsys, tmp_path, "latency", str(tiny_llama), "--input-lens", "8,32", "--output-len", "4",
                      "--num-iters", "1")
    rows = [line.split() for line in out.splitlines() if str(tiny_llama) in line]
    assert [(r[1], r[3]) for r in rows] == [("8", "cinq"), ("8", "HF"), ("32", "cinq"), ("32", "HF")]
    assert [r[10:12] for r in rows if r[3] == "cinq"] == [["HF", "fp32"]] * 2  # vs: cinq is paired with HF
    assert [(r["prompt_len"], r["engine"]) for r in data["rows"]] == [(8, "cinq fp32"), (8, "HF fp32"),
                                                                       (32, "cinq fp32"), (32, "HF fp32")]
    cinq, hf = data["rows"][:2]
    assert cinq["ratio"] == pytest.approx(cinq["tok_s"] / hf["tok_s"])


def test_latency_flags_reach_the_options(capsys, tmp_path, tiny_llama):
    out, data = bench(capsys, tmp_path, "latency", str(tiny_llama), "--input-lens", "8", "--output-len", "3",
                      "--num-iters", "1", "--rounds", "2", "--no-baseline", "--threads-list", "1,2")
    assert [(r["threads"], r["engine"], len(r["tok_s_runs"])) for r in data["rows"]] == [(1, "cinq fp32", 2),
                                                                                          (2, "cinq fp32", 2)]
    assert data["options"]["baselines"] == [] and "cinq fp32 decode:" in data["headline"]
    (line,) = error_lines(capsys, "latency", str(tiny_llama), "--baselines", "vllm")
    assert "baselines must be among hf,llama.cpp, got vllm" in line


def test_serve(capsys, tmp_path, tiny_llama):
    out, data = bench(capsys, tmp_path, "serve", str(tiny_llama), "--request-rates", "inf", "--num-prompts", "3",
                      "--input-len", "8", "--output-len", "4", "--no-hop")
    assert "offline engine (baseline)" in out and "server at rate inf / offline" in out
    (run,) = data["runs"]
    assert run["completed"] == 3 and run["failed"] == 0
    assert data["ratio_server_over_offline"] == pytest.approx(
        run["output_throughput"] / data["baseline"]["output_throughput"])
    # CPU accounting of each side (the server's counter ticks every 10 ms: 3 tiny requests may read 0)
    assert run["server_cores"] >= 0 and run["client_cores"] > 0 and data["baseline"]["cores"] > 0
    assert run["core_cores"] >= 0 and data["config"]["engine_core"] == "process"  # the core's process apart
    assert "CPU cores used: front end / core / client" in out and "hop" not in data


def test_prefix(capsys, tmp_path, tiny_llama):
    out, data = bench(capsys, tmp_path, "prefix", str(tiny_llama), "--prefix-len", "64", "--num-prompts", "4",
                      "--suffix-len", "8", "--num-conversations", "2", "--num-turns", "2", "--turn-len", "16",
                      "--reply-len", "8", "--output-len", "3", "--kv-fractions", "1,0.5")
    assert "off (baseline)" in out and "off / on (TTFT), on / off (tok/s)" in out
    assert ("goal (TTFT >= 5x lower, throughput >= 2x) " + ("met" if data["goal"]["met"] else "not met")) in out
    assert len(data["eviction_sweep"]) == 4


def test_spec(capsys, tmp_path, tiny_llama):
    spec = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}'
    out, data = bench(capsys, tmp_path, "spec", str(tiny_llama), "--speculative-config", spec, "--batch-sizes", "1,2",
                      "--num-prompts", "2", "--input-len", "16", "--output-len", "4")
    assert "plain tok/s (baseline)" in out and "speedup" in out
    assert [r["batch"] for r in data["rows"]] == [1, 2]
    assert all(r["greedy_identical"] for r in data["rows"])  # n-gram drafts are verified exactly


def test_stack(capsys, tmp_path, tiny_llama):
    out, data = bench(capsys, tmp_path, "stack", str(tiny_llama), "--num-prompts", "3", "--output-len", "2-3",
                      "--request-rate", "20", "--quant", "rtn:8", "--student", "", "--stack-speculative-config",
                      "null", "--num-problems", "1", "--ppl-tokens", "64", "--hf-batch-size", "2", "--variants-dir",
                      str(tmp_path / "variants"))
    labels = [r["label"] for r in data["rows"]]
    assert labels == ["HF transformers", "cinq paged + continuous batching", "+ prefix caching",
                      "+ flash-torch attention", "+ int8 RTN"]
    assert data["rows"][0]["tok_s_ratio"] == 1.0 and "x first" in out
    for r in data["rows"]:
        assert r["inf"]["output_tokens"] == data["workload"]["output_tokens"]
        assert r["cost_per_m_tokens"] == pytest.approx(1e6 / 3600 / r["inf"]["tok_s"])
        assert r["quality"]["n_problems"] == 1 and r["quality"]["perplexity"] > 1
    cinq_rows = data["rows"][1:]
    assert all(r["rate"]["output_tokens"] == data["workload"]["output_tokens"] for r in cinq_rows)
    assert cinq_rows[0]["inf"]["prefix_cache_hit_rate"] == 0 and cinq_rows[1]["engine_config"]["enable_prefix_caching"]
    assert cinq_rows[-1]["inf"]["weight_bytes"] < cinq_rows[-2]["inf"]["weight_bytes"]  # int8 weights
    # the flash row alone uses flash-torch on a CPU; the int8 row builds on the default (sdpa) path
    assert cinq_rows[2]["engine_config"]["attention_backend"] == "flash-torch"
    assert cinq_rows[3]["engine_config"]["attention_backend"] is None


def error_lines(capsys, *argv: str) -> list[str]:
    assert main(["bench", *argv]) == 2
    return capsys.readouterr().err.splitlines()


def test_bad_values_are_one_line(capsys, tiny_llama):
    assert error_lines(capsys, "prefix", str(tiny_llama), "--kv-fractions", "a,b") == [
        "cinq bench: error: --kv-fractions must be comma-separated numbers, got 'a,b'"]
    assert error_lines(capsys, "throughput", str(tiny_llama), "--input-len", "9-3") == [
        "cinq bench: error: --input-len must be N or LO-HI with 1 <= LO <= HI, got '9-3'"]
    (line,) = error_lines(capsys, "prefix", str(tiny_llama), "--prefix-len", "600", "--max-model-len", "256")
    assert "exceeds max_model_len 256" in line
    (line,) = error_lines(capsys, "spec", str(tiny_llama))
    assert "needs --speculative-config" in line
    (line,) = error_lines(capsys, "stack", str(tiny_llama), "--quant", "gptq:4/128,8")
    assert "--quant must name one quantized variant" in line
    (line,) = error_lines(capsys)
    assert "give a benchmark" in line


def test_unknown_flag_is_blamed_on_the_benchmark(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "latency", "--bogus"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[1] == "cinq bench latency: error: unrecognized arguments: --bogus"


def test_every_engine_flag_is_a_bench_flag(capsys):
    import dataclasses

    from cinq.config import EngineConfig
    with pytest.raises(SystemExit):
        main(["bench", "throughput", "--help"])
    text = capsys.readouterr().out
    for f in dataclasses.fields(EngineConfig):
        if f.name != "model":
            assert f.metadata.get("flag", "--" + f.name.replace("_", "-")) in text


def test_the_compute_peak_is_bf16_where_the_cpu_has_bf16_gemm_instructions(monkeypatch) -> None:
    import cinq.kernels.cpu_native as cpu_native
    for emulated, dtype in ((True, "float32"), (False, "bfloat16")):
        monkeypatch.setattr(cpu_native, "bf16_gemm_is_emulated", lambda e=emulated: e)
        assert peak_dtype() == dtype
