"""`cinq train`: a language model trained from scratch with cross-entropy on the tokenized corpus."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cinq.errors import InvalidParameterError
from cinq.train.data import BatchSampler, MixedBatchSampler, TokenSplit, task_tokens
from cinq.train.export import export_model
from cinq.train.presets import model_config, new_model
from cinq.train.tokenizer_train import load_tokenizer, special_ids
from cinq.train.trainer import Trainer
from cinq.train.training_run import RunControls, run_training, train_settings

log = logging.getLogger(__name__)


def causal_lm_loss(model: Any, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``batch`` [B, S+1]."""
    logits = model.compute_logits(model(batch[:, :-1]))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def validation_eval(model: Any, data_dir: str | Path, batch_size: int, seq_len: int, batches: int = 4,
                    seed: int = 1234) -> Any:
    """A function returning the mean CE of a fixed set of validation windows (the same at every call)."""
    val = TokenSplit.load(data_dir, "validation")
    sampler = BatchSampler(val.tokens, batch_size, seq_len, seed)
    fixed = [sampler.batch(i) for i in range(batches)]

    def evaluate() -> dict[str, float]:
        losses = [float(causal_lm_loss(model, b)) for b in fixed]
        return {"val_loss": sum(losses) / len(losses)}
    return evaluate


def initial_model(job: PretrainJob, vocab_size: int, bos: int, eos: int) -> Any:
    """A new model of ``job.config``, or, with ``job.init_from``, that folder's model in float32 (its
    vocabulary must be the tokenizer's)."""
    if job.task_fraction and not job.task:
        raise InvalidParameterError("task_fraction > 0 needs a task (e.g. arithmetic-easy)", "task")
    if not 0.0 <= job.task_fraction < 1.0:
        raise InvalidParameterError(f"task_fraction must be in [0, 1), got {job.task_fraction}", "task_fraction")
    if job.init_from is None:
        return new_model(model_config(job.config, vocab_size, bos, eos), job.seed)
    from cinq.assets import resolve_model_path
    from cinq.model.loader import load_model
    model = load_model(resolve_model_path(job.init_from), dtype="float32")
    if model.config.vocab_size != vocab_size:
        raise InvalidParameterError(f"init_from {job.init_from} has vocab_size {model.config.vocab_size}, the "
                                    f"tokenizer {vocab_size}", "init_from")
    return model.train()


@dataclass(slots=True)
class PretrainJob(RunControls):
    """Everything `cinq train` needs; ``token_budget`` sets the number of steps."""

    data_dir: str
    out_dir: str
    config: str = "cinq-tiny"
    tokenizer_dir: str | None = None  # default: <data_dir>/tokenizer
    token_budget: int = 10_000_000
    batch_size: int = 8
    seq_len: int = 512
    lr: float = 2e-3
    warmup_steps: int = 100
    decay_frac: float = 1.0
    weight_decay: float = 0.1
    eval_every: int = 200
    # Continued training (an anneal): start from this model folder's weights instead of random ones ...
    init_from: str | None = None
    # ... and/or draw this fraction of the rows from a generated task (other problems than the corpus holds).
    task: str | None = None
    task_fraction: float = 0.0
    task_problems: int = 40_000

    @property
    def tokenizer_path(self) -> Path:
        return Path(self.tokenizer_dir) if self.tokenizer_dir else Path(self.data_dir) / "tokenizer"


def pretrain(job: PretrainJob) -> dict[str, Any]:
    """Train (resuming if a checkpoint exists) and, once finished, export ``<out_dir>/model``."""
    torch.manual_seed(job.seed)
    tok = load_tokenizer(job.tokenizer_path)
    ids = special_ids(tok)
    model = initial_model(job, tok.get_vocab_size(), ids["bos"], ids["eos"])
    n_params = sum(p.numel() for p in model.parameters())
    train = TokenSplit.load(job.data_dir, "train")
    if job.task_fraction > 0:
        # Another seed than the corpus's own problems, so the extra rows are new problems.
        task = task_tokens(tok, job.task, job.task_problems, job.seed + 1)
        sampler = MixedBatchSampler([train.tokens, task], [1 - job.task_fraction, job.task_fraction],
                                    job.batch_size, job.seq_len, job.seed)
    else:
        sampler = BatchSampler(train.tokens, job.batch_size, job.seq_len, job.seed)
    settings = train_settings(job, {"config": job.config, "parameters": n_params, "data_dir": job.data_dir,
                                    "init_from": job.init_from, "task": job.task,
                                    "task_fraction": job.task_fraction})
    log.info("training %s (%.2fM parameters) for %d steps = %d tokens", job.config, n_params / 1e6,
             settings.total_steps, settings.total_steps * settings.tokens_per_step)
    trainer = Trainer(model, lambda batch, step: (causal_lm_loss(model, batch), {}), sampler.batch, settings,
                      eval_fn=validation_eval(model, job.data_dir, job.batch_size, job.seq_len))

    def export(summary: dict[str, Any]) -> None:
        summary["model_dir"] = str(export_model(model, job.tokenizer_path, Path(job.out_dir) / "model"))
        try:
            from cinq.train.plots import plot_loss_curves
            plot_loss_curves({job.config: trainer.history}, Path(job.out_dir) / "loss_curve.png",
                             evals={job.config: trainer.evals})
        except ImportError:  # matplotlib is optional
            log.warning("matplotlib not installed: no loss curve plot")
    return run_training(trainer, {"parameters": n_params, "config": job.config, "batch_size": job.batch_size,
                                  "seq_len": job.seq_len, "lr": job.lr, "seed": job.seed}, export)
