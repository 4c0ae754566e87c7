"""The set-up every training command shares (`cinq train`, fine-tuning, `cinq distill`, speculative heads):
the job's budget and optimiser fields become ``TrainSettings``, the shared ``Trainer`` runs (resuming from the
run folder), the result is exported once the run has finished, and ``summary.json`` is written either way."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Protocol

from cinq.errors import InvalidParameterError
from cinq.train.trainer import Trainer, TrainSettings

# Optional job fields and the value a job without one gets (the fine-tuning job has no decay or evaluation).
_OPTIONAL = {"weight_decay": 0.1, "decay_frac": 1.0, "eval_every": 0, "ckpt_every_s": 300.0, "max_run_s": None,
             "progress": True}


@dataclass(slots=True, kw_only=True)
class RunControls:
    """The run-keeping fields every training job has, with the same defaults (keyword-only, so a job's own
    positional fields keep their places): the seed, checkpoint interval, time limit per invocation, progress."""

    seed: int = 0
    ckpt_every_s: float = 300.0
    max_run_s: float | None = None  # stop (with a checkpoint) after this long in one invocation
    progress: bool = True


GENERATORS = ("engine", "naive")


@dataclass(slots=True, kw_only=True)
class GeneratingRunControls(RunControls):
    """The run-keeping fields of a job that samples its training sequences from a model (distillation's teacher
    or student, the heads' target): at ``sample_temperature``, through cinq's serving engine (``"engine"``) or
    in-memory sampling (``"naive"``: tests)."""

    sample_temperature: float = 1.0
    generator: str = "engine"

    def check_generator(self) -> None:
        if self.generator not in GENERATORS:
            raise InvalidParameterError(f"generator must be one of {GENERATORS}, got {self.generator!r}", "generator")


class TrainingJob(Protocol):
    """The fields a job needs for ``train_settings`` (plus, optionally, those of ``_OPTIONAL``)."""

    out_dir: str
    token_budget: int
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    seed: int


def train_settings(job: TrainingJob, extra: dict[str, Any], **overrides: Any) -> TrainSettings:
    """``TrainSettings`` for ``job``: as many steps as its token budget buys (at least one), warm-up capped at
    the step count; ``overrides`` set fields the job does not have (e.g. the heads' log interval)."""
    steps = max(1, job.token_budget // (job.batch_size * job.seq_len))
    fields = {name: getattr(job, name, default) for name, default in _OPTIONAL.items()}
    fields.update(overrides)
    return TrainSettings(out_dir=job.out_dir, total_steps=steps, batch_size=job.batch_size, seq_len=job.seq_len,
                         lr=job.lr, warmup_steps=min(job.warmup_steps, steps), seed=job.seed, extra=extra, **fields)


def run_training(trainer: Trainer, summary_extra: dict[str, Any],
                 export: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run ``trainer``, add ``summary_extra`` to its summary, call ``export(summary)`` when the run finished
    (it adds what it wrote, e.g. ``model_dir``), and write ``<out_dir>/summary.json``; returns the summary."""
    summary = trainer.run()
    summary.update(summary_extra)
    if summary["finished"] and export is not None:
        export(summary)
    out = Path(trainer.s.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
