"""The plan as text, markdown and JSON."""

from __future__ import annotations

import json

from cinq.plan.devices import get_device
from cinq.plan.memory import Precision
from cinq.plan.planner import PlanSettings, build_plan
from cinq.plan.report import format_table, plan_dict, render_plan, size
from cinq.plan.shapes import resolve_shape


def _plan():
    return build_plan(resolve_shape("Llama-3-70B"), get_device("H100-80GB"), Precision.from_name("bfloat16"),
                      PlanSettings(max_model_len=8192, concurrency=16))


def test_size_units():
    assert size(512) == "512 B" and size(128 * 1024) == "128.00 KiB" and size(3 * 2 ** 30) == "3.00 GiB"


def test_text_and_markdown_say_the_same():
    plan = _plan()
    text, md = render_plan(plan), render_plan(plan, markdown=True)
    for out in (text, md):
        assert "2 x H100-80GB" in out and "320.00 KiB" in out and "illustrative" in out
        assert f"{plan.batch1.tokens_per_s:,.1f}" in out
    assert "| tp | fits |" in md and "### memory per card" in md
    assert "|" not in text


def test_json_has_the_numbers():
    plan = _plan()
    out = json.loads(json.dumps(plan_dict(plan)))
    assert out["tensor_parallel_size"] == 2 and out["memory"]["fits"] is True
    assert out["kv_bytes_per_token_total"] == 2 * 80 * 8 * 128 * 2
    assert out["weight_bytes_total"] == plan.weight_bytes_total
    assert [r["fits"] for r in out["tp_sweep"]] == [False, True, True, True]
    assert out["device"]["name"] == "H100-80GB" and out["precision"]["quantized"] is False


def test_text_table_aligns_number_columns_right():
    table = format_table(["a", "n"], [["x", "1"], ["yy", "1,000"]], markdown=False).splitlines()
    assert table[2] == "x       1" and table[3] == "yy  1,000"
