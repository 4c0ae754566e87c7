"""Knowledge distillation: a student learns from a frozen teacher with any objective of ``cinq.train.objective``
under one of four data regimes:

* ``offpolicy`` — corpus windows; the loss compares student and teacher on every token (word-level KD);
* ``seqkd``     — sequence-level KD (Kim & Rush 2016): the teacher first writes text from corpus prompts with
                  cinq's engine; the student trains on that text (with CE and/or a divergence to the teacher);
* ``onpolicy``  — GKD (Agarwal et al. 2024): with probability ``student_fraction`` (GKD's lambda) a batch is the
                  student's own continuations of corpus prompts, scored by the teacher on the sampled tokens;
                  otherwise a corpus batch. Samples come from cinq's engine running a snapshot of the student
                  taken every ``refresh_every`` steps (the usual practice of engine-backed on-policy trainers);
* ``cot``       — chain-of-thought distillation on the arithmetic tasks (Distilling step-by-step, Hsieh et al.
                  2023): rationale task = the objective on the teacher's worked solutions (teacher rationales that
                  reach the right answer, the gold ones otherwise); answer task = CE on the bare answer, weighted
                  by ``cot_answer_weight``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, check_bounds
from cinq.model.loader import load_model
from cinq.train.cot import build_cot_examples, cot_batch
from cinq.train.data import BatchSampler, TokenSplit
from cinq.train.export import export_model
from cinq.train.generated_cache import keyed_path, model_identity
from cinq.train.losses import HiddenProjection, forward_kl, layer_map
from cinq.train.objective import Objective
from cinq.train.onpolicy import OnPolicyPool
from cinq.train.presets import model_config, new_model
from cinq.train.seqkd import teacher_token_stream
from cinq.train.spec_head_data import corpus_identity
from cinq.train.tokenizer_train import load_tokenizer, special_ids
from cinq.train.trainer import Trainer
from cinq.train.training_run import GeneratingRunControls, run_training, train_settings

log = logging.getLogger(__name__)
REGIMES = ("offpolicy", "seqkd", "onpolicy", "cot")


@dataclass(slots=True)
class DistillJob(GeneratingRunControls):
    """One distillation run (see the module docstring for the regimes)."""

    teacher: str
    student: str  # preset name, config.json, or a model folder to continue from
    data_dir: str
    out_dir: str
    loss: str = "fkl"
    regime: str = "offpolicy"
    temperature: float = 1.0
    beta: float = 0.5
    lam: float = 0.1
    hidden_layers: str = "final"
    token_budget: int = 2_000_000
    batch_size: int = 8
    seq_len: int = 512  # as the teacher: evaluation at 512 tokens of context stays in-distribution
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1
    student_fraction: float = bounded(0.5, ge=0, le=1)
    prompt_len: int = 64
    refresh_every: int = 20
    seqkd_sequences: int = 2000
    seqkd_max_tokens: int = 192
    cot_problems: int = 4000
    cot_answer_weight: float = 0.5
    cot_rationales: str = "teacher"
    eval_every: int = 100

    def __post_init__(self) -> None:
        self.check_generator()
        if self.regime not in REGIMES:
            raise InvalidParameterError(f"regime must be one of {REGIMES}, got {self.regime!r}", "regime")
        check_bounds(self)
        if self.regime == "onpolicy" and not (0 < self.prompt_len < self.seq_len):
            raise InvalidParameterError(f"prompt_len must be in (0, seq_len={self.seq_len}), got {self.prompt_len}",
                                        "prompt_len")
        if self.cot_rationales not in ("teacher", "gold"):
            raise InvalidParameterError(f"cot_rationales must be teacher or gold, got {self.cot_rationales!r}",
                                        "cot_rationales")


def load_student(spec: str, tokenizer_dir: Path, seed: int) -> Any:
    """A model folder is loaded (float32, to continue training); anything else is a shape to initialise."""
    path = Path(spec)
    if path.is_dir() and (path / "model.safetensors").is_file():
        return load_model(path, dtype="float32").train()
    tok = load_tokenizer(tokenizer_dir)
    ids = special_ids(tok)
    return new_model(model_config(spec, tok.get_vocab_size(), ids["bos"], ids["eos"]), seed)


def load_teacher(path: str | Path) -> Any:
    """A frozen float32 teacher (or draft-head target); a weight-only quantized one computes through its dense
    dequantized weights (the same function, at training-forward speed: cinq/layers/quantization/linear.py)."""
    from cinq.layers.quantization.linear import dequantize_weight_only
    teacher = load_model(path, dtype="float32")
    dequantize_weight_only(teacher)
    teacher.requires_grad_(False)
    return teacher.eval()


def _forward(model: Any, x: torch.Tensor, hidden: bool) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    if hidden:
        final, states = model.forward_with_hidden_states(x)
        return model.compute_logits(final), states
    return model.compute_logits(model(x)), None


class Distiller:
    """Builds the student, the objective, the regime's batches and loss, and runs the shared Trainer."""

    def __init__(self, job: DistillJob) -> None:
        self.job = job
        torch.manual_seed(job.seed)
        self.teacher_dir = Path(job.teacher)
        self.teacher = load_teacher(self.teacher_dir)
        self.student = load_student(job.student, self.teacher_dir, job.seed)
        tv, sv = self.teacher.config.vocab_size, self.student.config.vocab_size
        if tv != sv:
            raise InvalidParameterError(f"student vocab_size ({sv}) must equal the teacher's ({tv}): token-level KD "
                                        "compares distributions over the same vocabulary", "student")
        self.tok = load_tokenizer(self.teacher_dir)
        self.ids = special_ids(self.tok)
        self.objective = Objective.parse(job.loss, temperature=job.temperature, beta=job.beta, lam=job.lam,
                                         hidden_layers=job.hidden_layers)
        sl, tl = self.student.config.num_hidden_layers, self.teacher.config.num_hidden_layers
        self.objective.pairs = layer_map(sl, tl, job.hidden_layers)
        self.proj = HiddenProjection(self.student.config.hidden_size, self.teacher.config.hidden_size,
                                     len(self.objective.pairs)) if self.objective.needs_hidden else None
        train = TokenSplit.load(job.data_dir, "train")
        self.corpus = BatchSampler(train.tokens, job.batch_size, job.seq_len, job.seed)
        self.out = Path(job.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.pool: OnPolicyPool | None = None
        self.seqkd: BatchSampler | None = None
        self.cot_examples: list[Any] = []

    # -- per-regime data ---------------------------------------------------------------------------------------
    def prepare(self, total_steps: int) -> None:
        """Generate what the regime needs before training (cached in the run folder under a key of the settings
        that produced it, so resuming skips it and a changed teacher or setting regenerates it)."""
        j = self.job
        teacher = model_identity(self.teacher_dir)
        if j.regime == "seqkd":
            parts = {"teacher": teacher, "corpus": corpus_identity(j.data_dir), "sequences": j.seqkd_sequences,
                     "max_tokens": j.seqkd_max_tokens, "temperature": j.sample_temperature, "seed": j.seed,
                     "generator": j.generator}
            stream = teacher_token_stream(self, j.seqkd_sequences, j.seqkd_max_tokens,
                                          keyed_path(self.out, "seqkd", ".tokens.npy", parts))
            self.seqkd = BatchSampler(stream, j.batch_size, j.seq_len, j.seed)
        elif j.regime == "onpolicy":
            self.pool = OnPolicyPool(self, total_steps)
        elif j.regime == "cot":
            parts = {"teacher": teacher, "problems": j.cot_problems, "rationales": j.cot_rationales,
                     "seed": j.seed, "generator": j.generator}
            self.cot_examples = build_cot_examples(self, j.cot_problems,
                                                   keyed_path(self.out, "cot_examples", ".json", parts))

    def batch(self, step: int) -> Any:
        j = self.job
        if j.regime == "seqkd":
            return self.seqkd.batch(step)
        if j.regime == "onpolicy":
            return self.pool.batch(step)
        if j.regime == "cot":
            return cot_batch(self.cot_examples, self.ids, j.batch_size, j.seq_len, j.seed, step)
        return self.corpus.batch(step)

    # -- the loss ----------------------------------------------------------------------------------------------
    def loss(self, batch: Any, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        if isinstance(batch, torch.Tensor):
            tokens, mask, answer_mask = batch, None, None
        else:  # (tokens, mask of target positions[, answer mask]) from on-policy and CoT batches
            tokens, mask, answer_mask = batch[0], batch[1], batch[2] if len(batch) > 2 else None
        x, y = tokens[:, :-1], tokens[:, 1:]
        hidden = self.objective.needs_hidden
        s_logits, hs = _forward(self.student, x, hidden)
        t_logits, ht = None, None
        if self.objective.needs_teacher_logits or hidden:
            with torch.no_grad():
                t_logits, ht = _forward(self.teacher, x, hidden)
        total, metrics = self.objective(s_logits, t_logits, y, mask, hs, ht, self.proj)
        if answer_mask is not None and self.job.cot_answer_weight > 0:
            from cinq.train.losses import cross_entropy
            answer = cross_entropy(s_logits, y, answer_mask)
            total = total + self.job.cot_answer_weight * answer
            metrics["answer_ce"] = float(answer.detach())
        return total, metrics

    def eval_fn(self) -> Any:
        """Validation CE and forward KL to the teacher on fixed validation windows."""
        val = TokenSplit.load(self.job.data_dir, "validation")
        sampler = BatchSampler(val.tokens, self.job.batch_size, self.job.seq_len, 1234)
        fixed = [sampler.batch(i) for i in range(4)]

        def evaluate() -> dict[str, float]:
            ce, kl = [], []
            for b in fixed:
                s = self.student.compute_logits(self.student(b[:, :-1]))
                t = self.teacher.compute_logits(self.teacher(b[:, :-1]))
                ce.append(float(torch.nn.functional.cross_entropy(s.reshape(-1, s.shape[-1]), b[:, 1:].reshape(-1))))
                kl.append(float(forward_kl(s, t)))
            return {"val_loss": sum(ce) / len(ce), "val_kl_to_teacher": sum(kl) / len(kl)}
        return evaluate

    def run(self) -> dict[str, Any]:
        j = self.job
        n_params = sum(p.numel() for p in self.student.parameters())
        settings = train_settings(j, {"job": asdict(j), "student_parameters": n_params})
        steps = settings.total_steps
        self.prepare(steps)
        extra = torch.nn.ModuleDict({"proj": self.proj}) if self.proj is not None else None
        trainer = Trainer(self.student, self.loss, self.batch, settings, extra_modules=extra, eval_fn=self.eval_fn())
        if self.pool is not None:
            self.pool.trainer = trainer
        log.info("distilling %s -> %s (%.2fM parameters): regime %s, loss %s, %d steps", j.teacher, j.student,
                 n_params / 1e6, j.regime, j.loss, steps)

        def export(summary: dict[str, Any]) -> None:
            summary["model_dir"] = str(export_model(self.student, self.teacher_dir, self.out / "model"))
        return run_training(trainer, {"student_parameters": n_params, "job": asdict(j)}, export)


def distill(job: DistillJob) -> dict[str, Any]:
    """Run one distillation job (resuming from ``out_dir`` when it holds a checkpoint)."""
    return Distiller(job).run()
