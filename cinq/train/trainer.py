"""A plain PyTorch training loop shared by `cinq train` (cross-entropy) and `cinq distill` (KD losses).

AdamW, linear warmup + cosine decay, gradient clipping, bf16 autocast on CPU, seeded, resumable: a checkpoint
(model, extra trainable modules, optimizer, step, elapsed time, history) is written every ``ckpt_every_s``
seconds, at the end, and on SIGTERM/SIGINT. Batches depend only on (seed, step), so a resumed run follows the
same trajectory as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, check_bounds
from cinq.train.checkpoint import load_checkpoint, save_checkpoint
from cinq.train.schedule import decay_start, lr_at

log = logging.getLogger(__name__)

# (batch [B, S+1] token ids, step) -> (scalar loss to minimise, metrics to log)
LossFn = Callable[[torch.Tensor, int], tuple[torch.Tensor, dict[str, float]]]
BatchFn = Callable[[int], torch.Tensor]
EvalFn = Callable[[], dict[str, float]]


# Everything but the token budget (which may change during the constant-lr phase, see ``resume``).
_TRAJECTORY_FIELDS = ("batch_size", "seq_len", "lr", "min_lr_ratio", "warmup_steps", "decay_frac",
                      "weight_decay", "beta1", "beta2", "grad_clip", "seed", "bf16")


@dataclass(slots=True)
class TrainSettings:
    """Optimisation and bookkeeping settings of one run."""

    out_dir: str
    total_steps: int = bounded(ge=1, integer=True)
    batch_size: int = bounded(ge=1, integer=True)
    seq_len: int = bounded(ge=1, integer=True)
    lr: float = bounded(2e-3, gt=0, le=1)
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    # cosine over the last fraction of the post-warmup steps (1: warmup + cosine)
    decay_frac: float = bounded(1.0, gt=0, le=1)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    eval_every: int = 200
    ckpt_every_s: float = 300.0
    max_run_s: float | None = None  # stop (with a checkpoint) after this long in one invocation
    stop_at_step: int | None = None  # stop (with a checkpoint) once this step is done; resume later
    bf16: bool = True
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in the summary (model config, data, ...)

    def __post_init__(self) -> None:
        check_bounds(self)
        if not (0 <= self.warmup_steps <= self.total_steps):
            raise InvalidParameterError(
                f"warmup_steps must be in [0, total_steps={self.total_steps}], got {self.warmup_steps}",
                "warmup_steps")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


def param_groups(modules: list[nn.Module], weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices, none on norms, biases and embeddings (tied heads are embeddings)."""
    decay, no_decay, seen = [], [], set()
    for module in modules:
        embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
        for p in module.parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            (decay if p.dim() >= 2 and id(p) not in embeddings else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class _StopFlag:
    """Turns SIGTERM/SIGINT into a flag the loop checks, so it can checkpoint before exiting."""

    def __init__(self) -> None:
        self.stop = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        if _in_main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def _handler(self, signum: int, frame: Any) -> None:
        self.stop = True

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _in_main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _progress(total: int, initial: int, enabled: bool) -> Any:
    if not enabled:
        return contextlib.nullcontext(None)
    from tqdm import tqdm
    # Not a terminal (nohup log): update rarely so the log stays readable.
    interval = 0.5 if sys.stderr.isatty() else 30.0
    return tqdm(total=total, initial=initial, unit="step", mininterval=interval, dynamic_ncols=True)


class Trainer:
    """Runs ``loss_fn`` over ``batch_fn(step)`` for ``settings.total_steps`` steps, resuming from
    ``out_dir/checkpoint.safetensors`` when it exists. ``extra_modules`` (e.g. a KD projection) train along."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, batch_fn: BatchFn, settings: TrainSettings,
                 extra_modules: nn.Module | None = None, eval_fn: EvalFn | None = None) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.batch_fn = batch_fn
        self.s = settings
        self.extra = extra_modules if extra_modules is not None else nn.ModuleDict()
        self.eval_fn = eval_fn
        self.out = Path(settings.out_dir)
        self.ckpt_path = self.out / "checkpoint.safetensors"
        self.optimizer = torch.optim.AdamW(param_groups([model, self.extra], settings.weight_decay), lr=settings.lr,
                                           betas=(settings.beta1, settings.beta2))
        self.step = 0
        self.elapsed_s = 0.0  # training time over all invocations (evaluation and checkpoints excluded)
        self.history: list[dict[str, float]] = []
        self.evals: list[dict[str, float]] = []

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "extra": self.extra.state_dict(),
                "optimizer": self.optimizer.state_dict(), "step": self.step, "elapsed_s": self.elapsed_s,
                "history": self.history, "evals": self.evals, "total_steps": self.s.total_steps,
                "trajectory": self._trajectory()}

    def _trajectory(self) -> dict[str, Any]:
        """The settings a resumed run must share with the checkpoint to continue the same trajectory."""
        return {k: getattr(self.s, k) for k in _TRAJECTORY_FIELDS}

    def save(self) -> None:
        save_checkpoint(self.ckpt_path, self.state())
        self.write_history()

    def resume(self) -> bool:
        """Load ``checkpoint.safetensors`` if present; returns whether it did."""
        state = load_checkpoint(self.ckpt_path)
        if state is None:
            return False
        old_total, step = int(state["total_steps"]), int(state["step"])
        saved = state.get("trajectory") or {}
        changed = sorted(k for k in _TRAJECTORY_FIELDS if k in saved and saved[k] != getattr(self.s, k))
        if changed:
            raise InvalidParameterError(
                f"checkpoint {self.ckpt_path} was made with " + ", ".join(f"{k}={saved[k]}" for k in changed)
                + "; this run asks for " + ", ".join(f"{k}={getattr(self.s, k)}" for k in changed)
                + ": resume with the same settings, or use a new --out", changed[0])
        if old_total != self.s.total_steps:
            # Allowed only while every step taken so far had a learning rate that both totals agree on.
            same_so_far = step <= min(decay_start(old_total, self.s.warmup_steps, self.s.decay_frac),
                                      decay_start(self.s.total_steps, self.s.warmup_steps, self.s.decay_frac))
            if not same_so_far:
                raise InvalidParameterError(
                    f"checkpoint {self.ckpt_path} was made for total_steps={old_total} and is at step {step}, past "
                    f"the start of its learning-rate decay: resume with the same budget, or use a new --out "
                    f"(this run asks for total_steps={self.s.total_steps})", "total_steps")
            log.info("token budget changed from %d to %d steps during the constant-lr phase (step %d): the run "
                     "continues exactly as if planned with the new budget", old_total, self.s.total_steps, step)
        mismatch = sorted(set(state["model"]) ^ set(self.model.state_dict()))
        if mismatch:
            # e.g. a checkpoint from before q/k/v and gate/up were merged: its optimizer moments follow the old
            # parameters too, so there is nothing exact to convert it into
            raise InvalidParameterError(
                f"checkpoint {self.ckpt_path} holds other model tensors than this model ({len(mismatch)} differ, "
                f"e.g. {mismatch[0]!r}): it was written by another model layout; use a new --out", "checkpoint")
        self.model.load_state_dict(state["model"])
        self.extra.load_state_dict(state["extra"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.elapsed_s = int(state["step"]), float(state["elapsed_s"])
        self.history, self.evals = list(state["history"]), list(state["evals"])
        log.info("resumed %s at step %d/%d", self.ckpt_path, self.step, self.s.total_steps)
        return True

    def write_history(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "history.json").write_text(json.dumps(
            {"settings": asdict(self.s), "step": self.step, "elapsed_s": self.elapsed_s,
             "tokens_seen": self.step * self.s.tokens_per_step, "history": self.history, "evals": self.evals},
            indent=1) + "\n")

    # -- the loop ----------------------------------------------------------------------------------------------
    def _evaluate(self) -> None:
        if self.eval_fn is None:
            return
        self.model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.s.bf16):
            metrics = self.eval_fn()
        self.model.train()
        self.evals.append({"step": float(self.step), **metrics})
        log.info("step %d eval %s", self.step, {k: round(v, 4) for k, v in metrics.items()})

    def _steps(self) -> Iterator[int]:
        while self.step < self.s.total_steps:
            yield self.step

    def run(self) -> dict[str, Any]:
        """Train to ``total_steps`` (or until stopped); returns the run summary."""
        self.resume()
        self.model.train()
        self.extra.train()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        last_ckpt = time.monotonic()
        run_start = time.monotonic()
        window: list[float] = []
        window_metrics: dict[str, list[float]] = {}
        window_t = 0.0
        stopped = False
        with _StopFlag() as flag, _progress(self.s.total_steps, self.step, self.s.progress) as bar:
            for step in self._steps():
                t0 = time.perf_counter()
                lr = lr_at(step, self.s.total_steps, self.s.lr, self.s.warmup_steps, self.s.min_lr_ratio,
                           self.s.decay_frac)
                for g in self.optimizer.param_groups:
                    g["lr"] = lr
                batch = self.batch_fn(step)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.s.bf16):
                    loss, metrics = self.loss_fn(batch, step)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(params, self.s.grad_clip)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                dt = time.perf_counter() - t0
                self.elapsed_s += dt
                window_t += dt
                self.step = step + 1
                window.append(float(loss.detach()))
                for k, v in metrics.items():
                    window_metrics.setdefault(k, []).append(float(v))
                if self.step % self.s.log_every == 0 or self.step == self.s.total_steps:
                    tok_s = len(window) * self.s.tokens_per_step / max(window_t, 1e-9)
                    entry = {"step": float(self.step), "loss": sum(window) / len(window), "lr": lr,
                             "grad_norm": float(grad_norm), "tokens_per_s": tok_s, "elapsed_s": self.elapsed_s}
                    entry.update({k: sum(v) / len(v) for k, v in window_metrics.items()})
                    self.history.append(entry)
                    if bar is not None:
                        bar.set_postfix(loss=f"{entry['loss']:.3f}", tok_s=f"{tok_s:.0f}", lr=f"{lr:.2e}")
                    window, window_metrics, window_t = [], {}, 0.0
                if bar is not None:
                    bar.update(1)
                if self.s.eval_every and self.step % self.s.eval_every == 0 and self.step < self.s.total_steps:
                    self._evaluate()
                now = time.monotonic()
                if now - last_ckpt >= self.s.ckpt_every_s:
                    self.save()
                    last_ckpt = now
                if flag.stop or (self.s.max_run_s is not None and now - run_start >= self.s.max_run_s) or \
                        (self.s.stop_at_step is not None and self.step >= self.s.stop_at_step):
                    stopped = True
                    break
        if not stopped and (not self.evals or self.evals[-1]["step"] != self.step):
            self._evaluate()
        self.save()
        return {"finished": self.step >= self.s.total_steps, "step": self.step, "elapsed_s": self.elapsed_s,
                "tokens_seen": self.step * self.s.tokens_per_step,
                "final_loss": self.history[-1]["loss"] if self.history else None,
                "evals": self.evals[-1] if self.evals else None}
