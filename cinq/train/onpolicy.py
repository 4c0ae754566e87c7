"""On-policy batches for GKD: the student's own continuations of corpus prompts.

Which steps are on-policy is decided per step by a seeded draw (probability ``student_fraction``). Samples for
a window of ``refresh_every`` steps are generated together from one snapshot of the student, with cinq's
engine (or, with ``generator="naive"``, the in-memory student), and saved with the window so a resumed run
reuses them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from cinq.train.checkpoint import load_checkpoint, save_checkpoint
from cinq.train.data import window_rng
from cinq.train.export import export_model
from cinq.train.generation import generate_naive, generate_with_engine

log = logging.getLogger(__name__)


class OnPolicyPool:
    """Serves ``batch(step)``: a corpus tensor, or (tokens, target mask) built from student samples."""

    def __init__(self, distiller: Any, total_steps: int) -> None:
        self.d = distiller
        self.total_steps = total_steps
        self.path = Path(distiller.out) / "onpolicy_pool.safetensors"
        self.window = -1
        self.samples: dict[str, torch.Tensor] = {}
        self.trainer: Any = None

    def is_onpolicy(self, step: int) -> bool:
        return bool(window_rng(self.d.job.seed, step, 1).random() < self.d.job.student_fraction)

    def batch(self, step: int) -> Any:
        if not self.is_onpolicy(step):
            return self.d.corpus.batch(step)
        window = step - step % self.d.job.refresh_every
        if window != self.window:
            self._load_or_generate(window)
        return self.samples[f"{step}.tokens"], self.samples[f"{step}.mask"]

    def _load_or_generate(self, window: int) -> None:
        if self.path.is_file():
            saved = load_checkpoint(self.path)
            if saved is not None and int(saved["window"]) == window:
                self.window, self.samples = window, saved["samples"]
                return
        job = self.d.job
        steps = [s for s in range(window, min(window + job.refresh_every, self.total_steps)) if self.is_onpolicy(s)]
        prompts: list[list[int]] = []
        for s in steps:
            prompts.extend(self.d.corpus.batch(s)[:, :job.prompt_len].tolist())
        max_new = job.seq_len + 1 - job.prompt_len
        eos, pad = self.d.ids["eos"], self.d.ids["pad"]
        seed = job.seed * 1_000_003 + window
        if job.generator == "engine":
            snapshot = export_model(self.d.student, self.d.teacher_dir, Path(self.d.out) / "policy", torch.float32)
            outs = generate_with_engine(snapshot, prompts, max_new, job.sample_temperature, seed)
        else:
            outs = generate_naive(self.d.student, prompts, max_new, job.sample_temperature, seed, [eos])
        samples: dict[str, torch.Tensor] = {}
        for k, s in enumerate(steps):
            rows = range(k * job.batch_size, (k + 1) * job.batch_size)
            tokens = torch.full((job.batch_size, job.seq_len + 1), pad, dtype=torch.long)
            mask = torch.zeros(job.batch_size, job.seq_len, dtype=torch.bool)
            for r, i in enumerate(rows):
                gen = outs[i][:max_new]
                tokens[r, :job.prompt_len] = torch.tensor(prompts[i])
                tokens[r, job.prompt_len:job.prompt_len + len(gen)] = torch.tensor(gen, dtype=torch.long)
                # Position p predicts token p + 1: score exactly the sampled tokens.
                mask[r, job.prompt_len - 1:job.prompt_len - 1 + len(gen)] = True
            samples[f"{s}.tokens"], samples[f"{s}.mask"] = tokens, mask
        self.window, self.samples = window, samples
        save_checkpoint(self.path, {"window": window, "samples": samples})
        log.debug("on-policy window %d: %d batches sampled", window, len(steps))
