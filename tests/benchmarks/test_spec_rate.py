"""Speculation vs request rate: every arm at every rate, greedy outputs checked against plain decoding, and the
crossover rule."""

from __future__ import annotations

import math

import pytest

from cinq.bench.mixed_workload import MixedOptions
from cinq.bench.report import markdown
from benchmarks.spec_rate import NGRAM, PLAIN, SpecRateOptions, arm_configs, crossover, run_spec_rate
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError


def _row(rate: float, plain: float, spec: float) -> dict:
    return {"rate": rate, "arms": {PLAIN: {"tpot_p50_ms": plain}, "s": {"tpot_p50_ms": spec}}}


def test_crossover_is_the_lowest_rate_from_which_speculation_never_pays_again():
    assert crossover([_row(1, 10, 5), _row(4, 10, 8), _row(16, 10, 12), _row(math.inf, 10, 11)], "s") == 16
    assert crossover([_row(1, 10, 5), _row(4, 10, 12), _row(16, 10, 8)], "s") is None  # pays again at 16
    assert crossover([_row(4, 10, 12), _row(1, 10, 11)], "s") == 1  # never pays; rows in any order
    assert crossover([_row(1, 10, 5)], "s") is None
    assert crossover([_row(1, 10, 9.8), _row(4, 10, 9.9)], "s") == 1  # within the noise margin: no gain


def test_arms_are_plain_then_each_config_with_adaptive_off_and_on(tiny_llama):
    cfg = EngineConfig(model=str(tiny_llama), speculative_config={**NGRAM, "adaptive": True})
    arms = arm_configs(cfg, SpecRateOptions(speculative_configs=(dict(NGRAM),)))
    assert list(arms) == [PLAIN, "ngram k=3, adaptive off", "ngram k=3, adaptive on"]
    assert arms[PLAIN].speculative_config is None
    assert [a.speculative_config.adaptive for a in list(arms.values())[1:]] == [False, True]
    with pytest.raises(InvalidParameterError, match="rates"):
        SpecRateOptions(rates=(0.0,)).validate()
    with pytest.raises(InvalidParameterError, match="rounds"):
        SpecRateOptions(rounds=0).validate()


def test_run_serves_every_arm_at_every_rate(tiny_llama):
    opts = SpecRateOptions(rates=(50.0, math.inf), speculative_configs=(dict(NGRAM),), rounds=2,
                           workload=MixedOptions(num_requests=4, output_len=(4, 8), max_prompt_tokens=96))
    cfg = EngineConfig(model=str(tiny_llama), dtype="float32", num_threads=1, max_model_len=128, seed=0)
    res = run_spec_rate(cfg, opts, progress=False)
    data = res.data
    assert [r["rate"] for r in data["rows"]] == [50.0, math.inf] and len(data["arms"]) == 3
    out_tokens = data["workload"]["output_tokens"]
    for row in data["rows"]:
        for label, arm in row["arms"].items():
            assert arm["output_tokens"] == out_tokens and arm["mean_running"] >= 1
            assert len(arm["tpot_p50_rounds"]) == 2 and arm["tpot_p50_ms"] in arm["tpot_p50_rounds"]
            if label != PLAIN:
                assert 0 <= arm["same_as_plain"] <= 4 and (arm["tau"] is None or 1 <= arm["tau"] <= 4)
    assert set(data["crossover"]) == set(data["arms"][1:])
    assert "Crossover" in markdown(res)


def test_with_rounds_an_arm_pays_only_beyond_the_spread():
    from benchmarks.spec_rate import pays
    row = {"rate": 1.0, "arms": {PLAIN: {"tpot_p50_ms": 10, "tpot_p50_rounds": [9, 10, 12]},
                                 "a": {"tpot_p50_ms": 8, "tpot_p50_rounds": [7, 8, 8.5]},
                                 "b": {"tpot_p50_ms": 8, "tpot_p50_rounds": [7, 8, 9.5]}}}
    assert pays(row, "a") and not pays(row, "b")
