"""The thread-scaling profile: a linear kernel's calls named by the linear they serve (a split linear's part apart),
a real step's ops grouped that way, and the report's ratios with a 2-thread part matched to its 1-thread whole."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.thread_scaling import linear_names, per_op_us, render
from cinq.kernels.cpu_native import native_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_linears_are_named_by_width_and_rows_parts_by_either_half() -> None:
    cfg = SimpleNamespace(q_size=384, kv_size=128, hidden_size=384, intermediate_size=1024, vocab_size=8191)
    names = linear_names(cfg)
    assert names[(384, 640)] == "qkv_proj" and names[(384, 384)] == "o_proj"
    assert names[(384, 2048)] == "gate_up_proj" and names[(1024, 384)] == "down_proj"
    assert names[(384, 8191)] == "lm_head"
    assert names[(384, 4096)] == names[(384, 4095)] == "lm_head (part)"  # an odd row count splits either way
    assert names[(1024, 192)] == "down_proj (part)"
    assert (384, 100) not in names


def test_a_real_step_reports_its_linears_by_name() -> None:
    if native_module("small_m_gemm") is None:
        pytest.skip("native bf16 kernel unavailable here")
    import step_breakdown_measure as sbm

    engine = sbm._engine("cinq-tiny", 1, prompt_len=8)
    ops = per_op_us(engine, linear_names(engine.model_config), steps=2)
    for linear in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"):
        assert ops[f"cinq::small_m_linear {linear}"] > 0
    assert any(k.startswith("cinq::paged_decode [") for k in ops)  # no linear: by its input shapes


def _row(variant: str, threads: int, step: float, ops: dict[str, float]) -> dict:
    return {"variant": variant, "threads": threads, "weight_mb": 10.0, "step_ms": step, "kernel_ms": step - 0.5,
            "host_ms": 0.5, "ops_us": ops, "step_ms_all": [step]}


def test_the_report_matches_a_part_to_its_whole_and_gives_each_ratio() -> None:
    data = {"model": "cinq-tiny", "prompt_len": 128, "rounds": 1, "date": "d", "load_start": 0.1, "rows": [
        _row("int8", 1, 2.0, {"k gate_up_proj": 300.0, "k lm_head": 400.0, "attn [[1]]": 200.0}),
        _row("int8", 2, 1.6, {"k gate_up_proj (part)": 150.0, "k lm_head": 320.0, "attn [[1]]": 250.0})]}
    md = render(data)
    assert "| int8 | 10.0 | 2.000 | 1.600 | 1.25x |" in md
    assert "| `k gate_up_proj` (2 thr: its part) | 300 | 150 | 2.00x |" in md
    assert "| `k lm_head` | 400 | 320 | 1.25x |" in md
    assert "| `attn [[1]]` | 200 | 250 | 0.80x |" in md
