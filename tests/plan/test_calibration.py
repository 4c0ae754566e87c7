"""Calibration: the benchmark rows are read, and the step-time fit recovers a known model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cinq.errors import InvalidParameterError
from cinq.plan.calibration import calibrate, calibrated_tokens_per_s, calibration_dict, fit, read_rows
from cinq.plan.devices import get_device
from cinq.plan.roofline import decode_step

REPO = Path(__file__).resolve().parents[2]
MODEL = {"hidden": 128, "layers": 2, "heads": 4, "intermediate": 256, "vocab": 512}


def write_results(folder: Path, tok_s: dict[str, float]) -> None:
    """Benchmark result files in the shapes benchmarks/ writes, every speed looked up by its row's source."""
    v = lambda key: tok_s.get(key, 1.0)  # noqa: E731
    (folder / "throughput.json").write_text(json.dumps({
        "workload": {"model": MODEL}, "machine": {"threads": 2},
        "batch1": {"tok_s": v("throughput.json batch1")}}))
    (folder / "quant.json").write_text(json.dumps({"model": MODEL, "env": {"threads": 1}, "serving": [
        {"variant": name, **{key: {"tokens_per_s": v(f"quant.json {name} {key}")} for key in ("batch1", "batch32")}}
        for name in ("bf16", "int8", "int4", "w8a8")]}))
    sweep = [{"target": t, "batch": b, "method": m, "plain_tok_s": v(f"speculative.json plain {t} b{b}")}
             for t, batches in (("bf16", (1, 4, 16, 32)), ("int4", (1,))) for b in batches for m in ("ngram", "eagle")]
    (folder / "speculative.json").write_text(json.dumps({"machine": {"threads": 2, "max_tokens": 64},
                                                         "batch_sweep": sweep}))


def test_rows_read_from_every_source(tmp_path):
    write_results(tmp_path, {})
    rows, skipped = read_rows(tmp_path)
    sources = [r.source for r in rows]
    assert skipped == [] and len(rows) == 1 + 6 + 5  # w8a8 left out, speculative rows once per (target, batch)
    assert "quant.json int4 batch32" in sources and "speculative.json plain int4 b1" in sources
    int4 = next(r for r in rows if r.source == "quant.json int4 batch32")
    assert (int4.batch, int4.precision.name, int4.precision.group_size, int4.threads) == (32, "int4", 128, 1)
    assert int4.shape.config.hidden_size == 128 and int4.shape.config.tie_word_embeddings


def test_fit_recovers_a_known_step_model(tmp_path):
    cpu = get_device("EPYC-2vCPU")
    write_results(tmp_path, {})
    true = [2e-3, 0.5e-3, 1 / 0.6, 1 / 0.9]  # overhead, per sequence, memory / 60%, compute / 90%
    speeds = {}
    for r in read_rows(tmp_path)[0]:
        s = decode_step(r.shape.config, r.precision, cpu, r.batch, r.context_len)
        speeds[r.source] = r.batch / (true[0] + true[1] * r.batch + true[2] * s.memory_s + true[3] * s.compute_s)
    write_results(tmp_path, speeds)
    cal = calibrate(cpu, tmp_path)
    assert cal.coef == pytest.approx(true, rel=1e-6)
    for c in cal.rows:
        assert c.calibrated_tok_s == pytest.approx(c.row.measured_tok_s, rel=1e-6)
        assert c.held_out_tok_s == pytest.approx(c.row.measured_tok_s, rel=1e-6)  # exact model: no row needed
        assert c.roofline_tok_s > c.row.measured_tok_s  # the overheads only ever slow it down
    assert calibration_dict(cal)["coef"]["per-step overhead"] == pytest.approx(2e-3)
    # a batch and context no row had: the fitted model predicts it as the true one would
    shape, p = cal.rows[0].row.shape, cal.rows[0].row.precision
    s = decode_step(shape.config, p, cpu, 7, 300)
    expected = 7 / (true[0] + true[1] * 7 + true[2] * s.memory_s + true[3] * s.compute_s)
    assert calibrated_tokens_per_s(cal, shape, p, 7, 300) == pytest.approx(expected, rel=1e-6)


def test_fit_never_returns_negative_terms():
    # y falls with the second feature: an unconstrained fit would give it a negative coefficient
    coef = fit([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]], [3.0, 2.0, 1.0])
    assert coef[1] == 0.0
    # what is left is a constant fitted in relative error: sum(1 / y) / sum(1 / y^2)
    assert coef[0] == pytest.approx((1 / 3 + 1 / 2 + 1) / (1 / 9 + 1 / 4 + 1))


def test_missing_files_are_skipped_and_none_is_an_error(tmp_path):
    write_results(tmp_path, {})
    (tmp_path / "quant.json").unlink()
    rows, skipped = read_rows(tmp_path)
    assert skipped == ["quant.json"] and len(rows) == 6
    with pytest.raises(InvalidParameterError) as e:
        calibrate(get_device("EPYC-2vCPU"), tmp_path / "nothing")
    assert e.value.param == "results_dir"


def test_the_repositorys_measured_results_are_read():
    rows, skipped = read_rows(REPO / "benchmarks" / "results")
    assert not skipped and {r.source.split()[0] for r in rows} == {"throughput.json", "quant.json",
                                                                    "speculative.json"}
    assert all(r.measured_tok_s > 0 for r in rows)
