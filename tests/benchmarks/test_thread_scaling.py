"""The thread-scaling profile: a linear kernel's calls named by the linear they serve (a split linear's part apart),
a real step's ops grouped that way, and the report's ratios with a 2-thread part matched to its 1-thread whole."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.thread_scaling import linear_names, per_op_us, render, sbm
from cinq.kernels.cpu_native import native_module


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
    import torch

    if native_module("small_m_gemm") is None:
        pytest.skip("native bf16 kernel unavailable here")
    threads = torch.get_num_threads()
    try:
        engine = sbm._engine("cinq-tiny", 1, prompt_len=8)  # sets the thread count: restored for later tests
        ops = per_op_us(engine, linear_names(engine.model_config), steps=2)
    finally:
        torch.set_num_threads(threads)
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
    assert "split across the team" not in md  # no A/B run: no section
    data["split_ab"] = [{"variant": "int8", "prompt_len": 1024, "split_ms": 1.5, "whole_ms": 1.8}]
    assert "| int8 | 1024 | 1.500 | 1.800 | 1.20x |" in render(data)


def test_at_two_threads_the_stepping_threads_parts_are_named_parts() -> None:
    import torch

    mod = native_module("decode_layers")
    if mod is None:
        pytest.skip("the fused decode step is unavailable here")
    threads, split, attn = torch.get_num_threads(), mod.min_split_bytes(), mod.min_attention_split_bytes()
    mod.set_min_split_bytes(1)  # cinq-tiny's linears and its 2 kv heads' attention split at any size
    mod.set_min_attention_split_bytes(1)
    try:
        engine = sbm._engine("cinq-tiny", 2, prompt_len=8)
        ops = per_op_us(engine, linear_names(engine.model_config), steps=2)
    finally:
        mod.set_min_split_bytes(split)
        mod.set_min_attention_split_bytes(attn)
        torch.set_num_threads(threads)
    assert ops["cinq::small_m_linear gate_up_proj (part)"] > 0
    assert any(k.startswith("cinq::paged_decode [") and k.endswith(" (part)") for k in ops)
