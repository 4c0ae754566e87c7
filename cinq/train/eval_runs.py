"""Evaluate finished runs (and their teacher) and write the comparison report; evaluations are cached in each
run folder (``eval.json``) and redone only when the model file is newer."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cinq.train.distill import load_teacher
from cinq.train.distill_report import write_report
from cinq.train.evaluate import evaluate_folder

log = logging.getLogger(__name__)


def _cached_eval(model_dir: Path, cache: Path, data_dir: str, teacher: Any, n_arith: int) -> dict[str, Any]:
    weights = model_dir / "model.safetensors"
    if cache.is_file() and cache.stat().st_mtime >= weights.stat().st_mtime:
        cached = json.loads(cache.read_text())
        arith = cached.get("arithmetic", {})
        if arith.get("problems") == n_arith and "step_accuracy" in arith and ("kl_to_teacher" in cached) == (
                teacher is not None):
            return cached
    log.info("evaluating %s", model_dir)
    result = evaluate_folder(model_dir, data_dir, teacher=teacher, n_arith=n_arith)
    cache.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def run_row(run_dir: str | Path, data_dir: str, teacher: Any, n_arith: int) -> dict[str, Any]:
    """Evaluation of ``run_dir/model`` plus the run's tokens seen and training time."""
    run_dir = Path(run_dir)
    row = _cached_eval(run_dir / "model", run_dir / "eval.json", data_dir, teacher, n_arith)
    summary = json.loads((run_dir / "summary.json").read_text())
    row.update({"tokens_seen": summary["tokens_seen"], "train_seconds": summary["elapsed_s"]})
    return row


def teacher_row(teacher_dir: str | Path, cache_dir: Path, data_dir: str, n_arith: int) -> dict[str, Any]:
    teacher_dir = Path(teacher_dir)
    row = _cached_eval(teacher_dir, cache_dir / "teacher_eval.json", data_dir, None, n_arith)
    info = teacher_dir / "training.json"
    if info.is_file():
        t = json.loads(info.read_text())
        row.update({"tokens_seen": t.get("tokens_seen"), "train_seconds": t.get("elapsed_s")})
    return row


def report_runs(teacher_dir: str | Path, runs: dict[str, str], data_dir: str, prefix: str | Path,
                n_arith: int = 300) -> list[Path]:
    """Teacher + every run, one table row each, written to ``prefix``.md/.json/.png."""
    teacher = load_teacher(teacher_dir)
    cache_dir = Path(next(iter(runs.values()))).parent
    rows = {"teacher (cinq-tiny)": teacher_row(teacher_dir, cache_dir, data_dir, n_arith)}
    for name, run_dir in runs.items():
        rows[name] = run_row(run_dir, data_dir, teacher, n_arith)
    notes = ("Held-out = the corpus test split (documents never trained on) and the arithmetic test split "
             f"({n_arith} problems, greedy, exact match on the `Answer:` line; step acc: each worked step of those "
             "problems generated after the correct earlier steps, exact match of the line). KL→teacher = forward "
             "KL(teacher || student) per token on test windows. Students share shape, seed and data order; runs "
             "trained from scratch share the token budget, and only the loss/regime differs. A row \"X, then Y "
             "(+N)\" continues from X's weights: its tokens and time are the extra stage's only. `train s` is "
             "training-step time on this (shared) 2-core CPU; KD rows include the teacher's forward passes, "
             "seq-KD rows exclude the teacher's generation time.\n")
    return write_report(rows, prefix, "Distillation: cinq-tiny -> cinq-tiny-student", notes)
