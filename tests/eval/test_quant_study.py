"""The study runner: quantize variants, evaluate, report; resume from cached rows, recompute what a changed
setting affects; progress lines; failing and unsupported variants reported, not raised."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cinq.errors import InvalidParameterError
from cinq.eval.quant_quality import EvalSettings
from cinq.eval.quant_study import StudyConfig, run_study
from cinq.tasks import arithmetic_problems, step_items
from cinq.quant.variants import parse_variants
from tests.quant.conftest import arithmetic_text


class CountingOracle:
    """A generator factory that answers everything right and counts the folders it was asked to evaluate."""

    def __init__(self, n: int) -> None:
        self.problems = arithmetic_problems(n, seed=0, split="test")
        known = [p for seed in (0, 1) for p in arithmetic_problems(n, seed=seed, split="test")]
        self.whole = {p.prompt(): p.target() for p in known}
        self.steps = {it.prompt: it.expected for it in step_items(known)}
        self.folders: list[str] = []

    def __call__(self, path: Path):
        self.folders.append(Path(path).name)

        def generate(prompts, max_new_tokens, stop):
            return [(self.whole if stop == ("\nQuestion",) else self.steps)[p] for p in prompts], 1.0
        return generate


def config(model: Path, out: Path, oracle: CountingOracle, variants: str = "rtn:4,3", **settings) -> StudyConfig:
    specs, skipped = parse_variants(variants, [32])
    return StudyConfig(model, out, specs, settings=EvalSettings(n_problems=len(oracle.problems), decode_tokens=0,
                                                                **settings),
                       ppl_text=arithmetic_text(3, seed=5, split="test"), ppl_source="t", skipped=skipped,
                       calib_text=arithmetic_text(60, seed=6, split="validation"), calib_samples=4, calib_seq_len=64,
                       generator=oracle)


def test_second_run_reuses_rows_and_a_changed_setting_recomputes(trained_tiny, tmp_path):
    oracle = CountingOracle(3)
    progress = io.StringIO()
    first = run_study(config(trained_tiny, tmp_path, oracle), progress)
    assert oracle.folders == [trained_tiny.name, "rtn-w4-g32", "rtn-w3-g32"]
    assert [r.label for r in first.rows] == [trained_tiny.name, "rtn-w4-g32", "rtn-w3-g32"]
    assert first.rows[2].bits == 3 and first.rows[2].kl_vs_base > 0 and first.rows[0].kl_vs_base == 0.0
    lines = progress.getvalue().splitlines()
    assert lines[0].startswith("cinq eval: 3 rows (0 cached, 3 to compute)")
    assert lines[1].startswith(f"[1/3] {trained_tiny.name}: ") and "ETA" in lines[1] and "elapsed" in lines[2]
    assert {p.name for p in tmp_path.iterdir()} >= {"rows", "quality.md", "quality.json", "quality.png"}
    assert not (tmp_path / "variants" / "rtn-w4-g32").exists()  # deleted once its row is cached

    progress = io.StringIO()
    second = run_study(config(trained_tiny, tmp_path, oracle), progress)
    assert oracle.folders == [trained_tiny.name, "rtn-w4-g32", "rtn-w3-g32"]  # nothing evaluated again
    assert [r.to_dict() for r in second.rows] == [r.to_dict() for r in first.rows]
    assert "[3/3] rtn-w3-g32: cached" in progress.getvalue()

    run_study(config(trained_tiny, tmp_path, oracle, seed=1), None)  # an eval setting: every row again
    assert oracle.folders[3:] == [trained_tiny.name, "rtn-w4-g32", "rtn-w3-g32"]
    run_study(config(trained_tiny, tmp_path, oracle, seed=1, variants="rtn:4,3,2"), None)  # one more variant
    assert oracle.folders[6:] == ["rtn-w2-g32"]
    cfg = config(trained_tiny, tmp_path, oracle, seed=1)
    cfg.calib_samples = 2  # calibration does not touch RTN rows: nothing to redo
    run_study(cfg, None)
    assert oracle.folders[7:] == []
    cached = json.loads((tmp_path / "rows" / "rtn-w3-g32.json").read_text())
    assert cached["row"]["label"] == "rtn-w3-g32" and len(cached["key"]) == 64


def test_calibrated_variants_and_skips(trained_tiny, tmp_path):
    oracle = CountingOracle(2)
    report = run_study(config(trained_tiny, tmp_path, oracle, variants="gptq:3;awq:8;smoothquant:static"), None)
    assert [r.label for r in report.rows][1:] == ["gptq-w3-g32", "smoothquant-w8a8-static"]
    reasons = dict(report.skipped)
    assert "4-bit weights only" in reasons["awq-w8-g32"] and "per output channel" in " ".join(reasons.values())
    md = (tmp_path / "quality.md").read_text()
    assert "## Skipped variants" in md and "awq-w8-g32: the AWQ GEMM format stores 4-bit weights only" in md
    cfg = config(trained_tiny, tmp_path / "again", oracle, variants="gptq:4")
    cfg.calib_text = None
    with pytest.raises(InvalidParameterError, match="--calib FILE is required for the gptq variants"):
        run_study(cfg, None)


def test_a_failing_variant_is_reported_and_not_cached(trained_tiny, tmp_path, monkeypatch):
    import cinq.quant.pipeline as pipeline
    oracle = CountingOracle(2)

    def broken(*args, **kwargs):
        raise RuntimeError("Hessian exploded")
    monkeypatch.setattr(pipeline, "quantize_model", broken)
    report = run_study(config(trained_tiny, tmp_path, oracle, variants="rtn:4"), None)
    assert len(report.rows) == 1 and dict(report.skipped)["rtn-w4-g32"] == "failed: RuntimeError: Hessian exploded"
    assert not (tmp_path / "rows" / "rtn-w4-g32.json").exists()


def test_calibration_dtype_reaches_the_quantizer_and_keys_only_calibrated_rows(trained_tiny, tmp_path, monkeypatch):
    import torch

    import cinq.quant.pipeline as pipeline
    real, seen = pipeline.quantize_model, []

    def recording(src, dst, cfg, calib=None, **kwargs):
        seen.append((Path(dst).name, kwargs.get("calib_dtype")))
        return real(src, dst, cfg, calib, **kwargs)
    monkeypatch.setattr(pipeline, "quantize_model", recording)
    oracle = CountingOracle(2)
    cfg = config(trained_tiny, tmp_path, oracle, variants="rtn:4;gptq:4")
    cfg.calib_dtype = "float32"
    run_study(cfg, None)
    assert seen == [("rtn-w4-g32", torch.float32), ("gptq-w4-g32", torch.float32)]
    run_study(config(trained_tiny, tmp_path, oracle, variants="rtn:4;gptq:4"), None)  # back to the bf16 default
    assert seen[2:] == [("gptq-w4-g32", torch.bfloat16)]  # the RTN row did not depend on it: cached
