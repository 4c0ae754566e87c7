"""The quantization study in one call: quantize a model into every requested variant, evaluate each
(cinq.eval.quant_quality), and write the report (cinq.eval.quality_report) into the study folder.

Resumable: each finished row is cached as ``<out>/rows/<label>.json`` together with the key it was computed
under: a hash of the variant spec, the source model's content, the evaluation settings, the perplexity and
calibration texts, the baseline model (KL is measured against it) and the torch thread count (tokens/s). A
rerun takes the rows whose key matches and recomputes the others, so a changed setting recomputes exactly what
it affects. Quantized folders go to ``<out>/variants/<label>`` and are deleted once their row is cached unless
``keep_variants``; an interrupted run reuses a folder whose quantization finished (its ``cinq_variant.json``
matches). Progress: one line per row on stderr with elapsed time and an ETA from the rows computed so far.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from cinq.cache import content_hash
from cinq.errors import InvalidParameterError
from cinq.eval.findings import FLAT_PPL_PCT, Z
from cinq.eval.quality_report import ModelQuality, QualityReport
from cinq.eval.quant_quality import EvalSettings, GeneratorFactory, baseline_scores, evaluate_model
from cinq.quant.variants import VariantSpec, split_supported

log = logging.getLogger(__name__)
ROW_VERSION = 1  # bump when a row's meaning changes: every cached row is then recomputed
MARKER = "cinq_variant.json"


@dataclass(slots=True)
class StudyConfig:
    """A study: ``model`` (dense folder) and its ``variants``; ``folders``: more finished folders to report as
    rows (label -> folder). Calibration text is needed by every method but RTN."""

    model: Path
    out: Path
    variants: list[VariantSpec] = field(default_factory=list)
    folders: dict[str, Path] = field(default_factory=dict)
    settings: EvalSettings = field(default_factory=EvalSettings)
    ppl_text: str = ""
    ppl_source: str = ""
    calib_text: str | None = None
    calib_samples: int = 128
    calib_seq_len: int = 256
    calib_seed: int = 0
    # Calibration forwards' dtype (cinq.quant.pipeline's default: bf16). float32 on CPUs without bf16 matmul
    # units, where bf16 forwards run several times slower (measured 6.5x on a Zen 3 core).
    calib_dtype: str = "bfloat16"
    skipped: list[tuple[str, str]] = field(default_factory=list)  # from parsing (cinq.quant.variants)
    keep_variants: bool = False
    generator: str | GeneratorFactory = "engine"
    base_label: str = ""
    title: str = ""
    flat_ppl_pct: float = FLAT_PPL_PCT  # findings: |Δppl| percent that counts as flat
    z: float = Z  # findings: a fall beyond z SEs of the paired difference counts


def _text_hash(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()


def _key(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(slots=True)
class _Row:
    label: str
    folder: Path | None  # None until a variant is quantized
    spec: VariantSpec | None
    key: str
    quant_key: str = ""


class _Progress:
    """One line per row on ``stream``: elapsed time and an ETA from the mean cost (per method) so far."""

    def __init__(self, total: int, pending: list[_Row], stream: TextIO | None) -> None:
        self.total, self.stream, self.start = total, stream, time.perf_counter()
        self.pending = {r.label: r for r in pending}
        self.costs: dict[str, list[float]] = {}

    @staticmethod
    def _method(row: _Row) -> str:
        return row.spec.method if row.spec is not None else "folder"

    def done(self, index: int, row: _Row, status: str, seconds: float | None = None) -> None:
        self.pending.pop(row.label, None)
        if seconds is not None:
            self.costs.setdefault(self._method(row), []).append(seconds)
        if self.stream is None:
            return
        every = [c for cs in self.costs.values() for c in cs]
        eta = None
        if every:
            mean = sum(every) / len(every)
            eta = sum(sum(self.costs[m]) / len(self.costs[m]) if (m := self._method(r)) in self.costs else mean
                      for r in self.pending.values())
        elapsed = time.perf_counter() - self.start
        print(f"[{index}/{self.total}] {row.label}: {status} | elapsed {_clock(elapsed)}, ETA "
              f"{'?' if eta is None and self.pending else _clock(eta or 0.0)}", file=self.stream, flush=True)


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def run_study(cfg: StudyConfig, progress: TextIO | None = sys.stderr) -> QualityReport:
    """Run (or resume) the study ``cfg`` and save its report as ``<out>/quality.{md,json,png}``."""
    from cinq.model.config import ModelConfig
    out = Path(cfg.out)
    (out / "rows").mkdir(parents=True, exist_ok=True)
    model_cfg = ModelConfig.from_pretrained(cfg.model)
    variants, skipped = split_supported(cfg.variants, model_cfg)
    skipped = list(cfg.skipped) + skipped
    if variants and model_cfg.quantization_config:
        raise InvalidParameterError(f"{cfg.model} is already quantized: --variants quantize a dense model", "model")
    if any(v.needs_calibration for v in variants) and not cfg.calib_text:
        need = sorted({v.method for v in variants if v.needs_calibration})
        raise InvalidParameterError(f"--calib FILE is required for the {', '.join(need)} variants (calibration text "
                                    f"must come from a local file)", "calib")
    model_hash = content_hash(cfg.model)
    common = {"version": ROW_VERSION, "settings": cfg.settings.to_dict(), "ppl": _text_hash(cfg.ppl_text),
              "base": model_hash, "threads": torch.get_num_threads()}
    calib = {"text": _text_hash(cfg.calib_text), "samples": cfg.calib_samples, "seq_len": cfg.calib_seq_len,
             "seed": cfg.calib_seed}
    if cfg.calib_dtype != "bfloat16":  # keyed only when set, so the caches of earlier studies stay valid
        calib["dtype"] = cfg.calib_dtype
    rows = [_Row(cfg.base_label or cfg.model.name, cfg.model, None, _key({**common, "folder": model_hash}))]
    for label, folder in cfg.folders.items():
        rows.append(_Row(label, Path(folder), None, _key({**common, "folder": content_hash(Path(folder))})))
    for v in variants:
        qkey = _key({"spec": v.to_dict(), "model": model_hash, "calib": calib if v.needs_calibration else None})
        rows.append(_Row(v.label, None, v, _key({**common, "quantized": qkey}), qkey))
    labels = [r.label for r in rows]
    if len(set(labels)) != len(labels):
        raise InvalidParameterError(f"row labels must be unique, got {labels}", "models")

    cached = {r.label: _load_row(out, r) for r in rows}
    pending = [r for r in rows if cached[r.label] is None]
    bar = _Progress(len(rows), pending, progress)
    if progress is not None:
        print(f"cinq eval: {len(rows)} rows ({len(rows) - len(pending)} cached, {len(pending)} to compute), "
              f"{len(skipped)} skipped; results in {out}", file=progress, flush=True)
    state: dict[str, Any] = {}
    results: list[ModelQuality] = []
    for i, r in enumerate(rows, 1):
        row = cached[r.label]
        if row is not None:
            results.append(row)
            bar.done(i, r, "cached")
            continue
        t0 = time.perf_counter()
        try:
            row = _compute(cfg, r, i == 1, state, out)
        except Exception as e:  # one failing variant must not end a long study
            if i == 1:
                raise
            log.exception("%s failed", r.label)
            skipped.append((r.label, f"failed: {type(e).__name__}: {e}"))
            bar.done(i, r, f"FAILED ({type(e).__name__}: {e})", time.perf_counter() - t0)
            continue
        _row_file(out, r.label).write_text(json.dumps({"key": r.key, "row": row.to_dict()}) + "\n")
        results.append(row)
        bar.done(i, r, f"{row.quantize_seconds:.1f} s quantize + {row.eval_seconds:.1f} s eval",
                 time.perf_counter() - t0)
        if r.spec is not None and not cfg.keep_variants and r.folder is not None:
            shutil.rmtree(r.folder, ignore_errors=True)
    if results and results[0].kl_vs_base is None and cfg.ppl_text and len(results) > 1:
        results[0].kl_vs_base, results[0].top1_vs_base = 0.0, 1.0
    report = QualityReport(results, cfg.ppl_source, cfg.settings.task, skipped, cfg.flat_ppl_pct, cfg.z, cfg.title)
    report.save(out, "quality")
    return report


def _row_file(out: Path, label: str) -> Path:
    return out / "rows" / (re.sub(r"[^A-Za-z0-9._-]", "_", label) + ".json")


def _load_row(out: Path, r: _Row) -> ModelQuality | None:
    path = _row_file(out, r.label)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return ModelQuality.from_dict(data["row"]) if data.get("key") == r.key else None


def _compute(cfg: StudyConfig, r: _Row, is_base: bool, state: dict[str, Any], out: Path) -> ModelQuality:
    """Quantize (variants) and evaluate one row; ``state`` carries the loaded baseline and calibration."""
    quantize_seconds = 0.0
    if r.spec is not None:
        r.folder, quantize_seconds = _quantize(cfg, r, state, out)
    base = None
    if not is_base and cfg.ppl_text:
        if "base" not in state:  # the baseline's log-probs, taken once for every row's KL / top-1
            state["base"] = baseline_scores(cfg.model, cfg.ppl_text, cfg.settings)
        base = state["base"]
    assert r.folder is not None
    row = evaluate_model(r.folder, cfg.ppl_text, cfg.settings, r.label, base, cfg.generator)
    if is_base and cfg.ppl_text:
        row.kl_vs_base, row.top1_vs_base = 0.0, 1.0
    row.quantize_seconds = quantize_seconds
    if r.spec is not None:
        row.spec, row.path = r.spec.label, f"<out>/variants/{r.label}"
    return row


def _quantize(cfg: StudyConfig, r: _Row, state: dict[str, Any], out: Path) -> tuple[Path, float]:
    """The variant's folder (made now, or left complete by an interrupted run) and the seconds it took."""
    from cinq.quant.pipeline import quantize_model
    assert r.spec is not None
    folder = out / "variants" / r.label
    try:
        marker = json.loads((folder / MARKER).read_text())
        if marker.get("key") == r.quant_key:
            return folder, float(marker.get("seconds", 0.0))
    except (OSError, ValueError):
        pass
    shutil.rmtree(folder, ignore_errors=True)
    calib = None
    if r.spec.needs_calibration:
        if "calib" not in state:
            from cinq.model.tokenizer import Tokenizer
            from cinq.quant.calibration import calibration_windows
            tok = Tokenizer.from_pretrained(cfg.model)
            state["calib"] = calibration_windows(tok.encode(cfg.calib_text or "", add_special_tokens=False),
                                                 cfg.calib_samples, cfg.calib_seq_len, cfg.calib_seed)
        calib = state["calib"]
    from cinq.model.loader import parse_dtype
    res = quantize_model(cfg.model, folder, r.spec.quant_config(), calib, progress=False,
                         calib_dtype=parse_dtype(cfg.calib_dtype))
    (folder / MARKER).write_text(json.dumps({"key": r.quant_key, "spec": r.spec.to_dict(),
                                             "seconds": res.seconds}) + "\n")
    return folder, res.seconds
