"""SmoothQuant static vs dynamic vs bf16 under the mixed workload: every model serves every request, the bf16
row is its own reference, the quantized rows are not, and a batch-mates run is folded in by label."""

from __future__ import annotations

import pytest

from cinq.bench.mixed_workload import MixedOptions
from cinq.bench.report import markdown
from cinq.bench.served_quality import QualitySettings
from benchmarks.smoothquant_mix import (DYNAMIC, REFERENCE, STATIC, SmoothQuantMixOptions, run_smoothquant_mix,
                                        single_language_label)
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError


def test_bad_rate_names_the_field():
    with pytest.raises(InvalidParameterError, match="request_rate"):
        SmoothQuantMixOptions(request_rate=float("inf")).validate()
    with pytest.raises(InvalidParameterError, match="language_tokens"):
        SmoothQuantMixOptions(language_tokens=1).validate()
    with pytest.raises(InvalidParameterError, match="rounds"):
        SmoothQuantMixOptions(rounds=0).validate()
    with pytest.raises(InvalidParameterError, match="calibration_language"):
        SmoothQuantMixOptions(calibration_language="klingon").validate()


def test_three_models_served_and_scored(tiny_llama, tmp_path):
    opts = SmoothQuantMixOptions(workload=MixedOptions(num_requests=4, output_len=(3, 6), max_prompt_tokens=96),
                                 request_rate=50.0, quality=QualitySettings(ppl_tokens=64, context_len=32,
                                                                            n_problems=0),
                                 language_tokens=40, rounds=2, calibration_language="zh",
                                 variants_dir=str(tmp_path))
    mates = {"bf16 (control)": [{"batch": 2, "pairs": 4, "differ": 0}, {"batch": 4, "pairs": 4, "differ": 1}]}
    cfg = EngineConfig(model=str(tiny_llama), dtype="bfloat16", num_threads=1, max_model_len=128, seed=0)
    res = run_smoothquant_mix(cfg, opts, batch_mates=mates, progress=False)
    rows = res.data["rows"]
    assert [r["label"] for r in rows] == [REFERENCE, STATIC, DYNAMIC, single_language_label("zh")]
    out_tokens = res.data["workload"]["output_tokens"]
    for r in rows:
        assert r["inf"]["output_tokens"] == r["rate"]["output_tokens"] == out_tokens
        assert set(r["kl_by_language"]) == set(res.data["language_tokens"])
        assert 0 <= r["same_as_bf16"] <= 4
        rounds = r["tok_s_rounds"]
        assert len(rounds["inf"]) == len(rounds["rate"]) == 2 and r["inf"]["tok_s"] in rounds["inf"]
    assert len({r["model"] for r in rows}) == 4  # the single-language copy is its own variant
    ref = rows[0]
    assert ref["same_as_bf16"] == 4 and ref["quality"]["kl"] < 1e-6
    assert all(v < 1e-6 for v in ref["kl_by_language"].values())
    assert all(r["quality"]["kl"] > 0 for r in rows[1:])  # 8-bit activations and weights are not bf16
    assert ref["batch_mates"] == {"differ": 1, "pairs": 8, "batch_sizes": [2, 4]}
    assert rows[1]["batch_mates"] is None
    text = markdown(res)
    assert "per language" in text and "1 / 8" in text and "zh-only static / static" in text
    assert res.notes[0].startswith("Reading") and "Calibrated on zh alone" in res.notes[0]
    assert (tmp_path / "calibration-zh.txt").is_file()
