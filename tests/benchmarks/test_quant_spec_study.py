"""The quantized-target x speculation table (benchmarks/quant_spec_study.py): every head that applies runs on every
target against that target's plain decoding, keeps its greedy output, and the report rebuilds from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.quant_spec_study import Head, QuantSpecOptions, heads_for, quant_spec_result, run_quant_spec
from cinq.bench.report import markdown, write_report
from cinq.errors import InvalidParameterError
from cinq.model.loader import load_model
from cinq.quant.config import QuantConfig
from cinq.quant.pipeline import quantize_model
from cinq.spec.eagle import new_eagle_head, save_eagle_head


@pytest.fixture(scope="module")
def setup(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], list[Head],
                                                                                  dict[str, Head]]:
    root = tmp_path_factory.mktemp("quant-spec")
    int4 = root / "int4"
    quantize_model(tiny_llama, int4, QuantConfig("rtn", 4, 32), None, progress=False)
    dense_head = save_eagle_head(new_eagle_head(load_model(tiny_llama, torch.float32), "eagle", seed=1),
                                 root / "head-dense")
    own_head = save_eagle_head(new_eagle_head(load_model(int4, torch.float32), "eagle", seed=2), root / "head-int4")
    return ({"bf16": tiny_llama, "int4": int4}, [Head("dense-trained", Path(dense_head), "bf16", "none")],
            {"int4": Head("retrained", Path(own_head), "int4", "none")})


def test_heads_for_adds_the_targets_own_head_once() -> None:
    a, b = Head("a", Path("x"), "bf16", ""), Head("b", Path("y"), "int4", "")
    assert heads_for("bf16", [a], {"int4": b}) == [a]
    assert heads_for("int4", [a], {"int4": b}) == [a, b]
    assert heads_for("bf16", [a], {"bf16": Head("a2", Path("x"), "bf16", "")}) == [a]  # same folder: once


def test_every_head_runs_on_its_targets_and_keeps_greedy_output(setup, tmp_path: Path) -> None:
    targets, general, retrained = setup
    options = QuantSpecOptions(num_prompts=2, prompt_len=12, max_tokens=6, k=2, offline_prompts=3,
                               offline_max_tokens=8, extra={"teacher": "tiny"})
    result = run_quant_spec(targets, general, retrained, options, control="dense-trained", progress=False)
    rows = result.data["rows"]
    got = sorted((r["target"], r["head"], r["adaptive"]) for r in rows)
    assert got == sorted([("bf16", "dense-trained", True), ("bf16", "dense-trained", False),
                          ("int4", "dense-trained", True), ("int4", "dense-trained", False),
                          ("int4", "retrained", True), ("int4", "retrained", False)])
    assert all(r["greedy_identical"] for r in rows)
    fixed = [r for r in rows if not r["adaptive"]]
    assert all(1.0 <= r["tau"] <= options.k + 1 for r in fixed)  # k fixed: every step drafts
    offline, effects, summary = result.tables[0], result.tables[1], result.tables[2]
    assert "Held-out tau offline" in offline.title and "Served" in effects.title
    held = {(r["target"], r["head"]): r["tau"] for r in result.data["offline"]}
    assert set(held) == {(t, h) for t, h, _ in got} and all(1.0 <= v <= options.k + 1 for v in held.values())
    assert offline.rows[1][-2] == held["int4", "retrained"]
    assert [row[0] for row in summary.rows] == ["bf16", "int4"]
    assert summary.rows[0][summary.columns.index("tau retrained (k fixed)")] is None  # not measured on bf16
    # the comparison: the retrained head's tau against the control's on the same target, at fixed k
    tau = {(r["target"], r["head"]): r["tau"] for r in fixed}
    assert effects.rows[1][-2:] == [tau["int4", "retrained"],
                                    f"{tau['int4', 'retrained'] - tau['int4', 'dense-trained']:+.2f}"]
    assert effects.rows[1][1] == (f"{tau['int4', 'dense-trained']:.2f} "
                                  f"({tau['int4', 'dense-trained'] - tau['bf16', 'dense-trained']:+.2f})")
    # the report rebuilds from its own JSON, with what was recorded alongside
    write_report(result, tmp_path / "qs")
    again = quant_spec_result(json.loads((tmp_path / "qs.json").read_text()))
    assert markdown(again) == markdown(result) and "teacher: tiny" in markdown(again)
    assert "Reading: int4 drafts alike" in markdown(quant_spec_result({**result.data, "reading": "int4 drafts alike"}))


def test_bad_input_names_the_field(setup) -> None:
    targets, general, retrained = setup
    with pytest.raises(InvalidParameterError) as e:
        run_quant_spec(targets, general, {"int8": retrained["int4"]}, QuantSpecOptions(), progress=False)
    assert e.value.param == "retrained"
    with pytest.raises(InvalidParameterError) as e:
        run_quant_spec(targets, general, retrained, QuantSpecOptions(k=0), progress=False)
    assert e.value.param == "k"
    with pytest.raises(InvalidParameterError) as e:
        run_quant_spec(targets, general, retrained, QuantSpecOptions(), control="nope", progress=False)
    assert e.value.param == "control"
