"""The latency report from its JSON alone (what benchmarks/latency.py --render does)."""

from __future__ import annotations

from cinq.bench.latency_report import latency_result
from cinq.bench.report import markdown


def _row(engine: str, tok_s: float, vs: str | None, ratio: float | None) -> dict:
    return {"model": "m", "prompt_len": 128, "threads": 1, "engine": engine, "tok_s": tok_s, "ms_step": 1000 / tok_s,
            "prefill_s": 0.02, "loadavg_1m": [1.0], "vs": vs, "ratio": ratio}


def test_a_report_written_before_the_fold_renders_with_its_absent_line_and_goal():
    data = {"rows": [_row("cinq bf16", 50.0, "llama.cpp bf16", 0.5), _row("llama.cpp bf16", 100.0, None, None),
                     _row("cinq int4", 80.0, "llama.cpp q4_0", None)],
            "llama_cpp_absent": None, "new_tokens": 32, "rounds": 5,
            "machine": {"cpu": "x86_64", "torch": "2", "llama_cpp": "0.3"}}
    result = latency_result(data)
    assert result.headline == "cinq bf16 / llama.cpp bf16 decode tok/s: 0.50x (prompt 128, 1 thr)"
    assert result.notes[0] == "- goal bf16 >= 1.0x llama.cpp bf16: **missed** (0.50x to 0.50x over 1 settings)"
    cinq = result.tables[0].rows[0]
    assert cinq[3:5] == ["cinq bf16", 50.0] and cinq[9:11] == ["llama.cpp bf16", "+10.00"]
    data["llama_cpp_absent"] = "llama-cpp-python not installed"
    data["rows"] = data["rows"][:1]
    data["rows"][0]["ratio"] = None
    text = markdown(latency_result(data))
    assert text.count("llama.cpp baseline ABSENT: llama-cpp-python not installed") == 1
    assert "| absent |" in text
